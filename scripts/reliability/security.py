"""Security checks: model loading never unpickles (an AST scan of our code), and the production profile's settings
in effect on a real server (tokens on both APIs, registration only from the model store, the request size limit)."""

from pathlib import Path

import requests

from scripts.reliability.rows import Row
from scripts.reliability.traffic import strict_json

REPO = Path(__file__).resolve().parents[2]


def unsafe_loading(paths=("handlers", "scripts")):
    """Every torch.load in our code passes weights_only=True, and nothing calls pickle.load(s) (checked on the AST)."""
    import ast

    problems, files = [], 0
    for folder in paths:
        for file in sorted((REPO / folder).rglob("*.py")):
            files += 1
            for node in ast.walk(ast.parse(file.read_text(), str(file))):
                if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
                    continue
                owner = node.func.value.id if isinstance(node.func.value, ast.Name) else ""
                where = f"{file.relative_to(REPO)}:{node.lineno}"
                if owner == "torch" and node.func.attr == "load":
                    safe = any(
                        k.arg == "weights_only" and isinstance(k.value, ast.Constant) and k.value.value is True
                        for k in node.keywords
                    )
                    if not safe:
                        problems.append(f"{where}: torch.load without weights_only=True")
                if owner == "pickle" and node.func.attr in ("load", "loads"):
                    problems.append(f"{where}: pickle.{node.func.attr}")
    # Scanning nothing (a moved folder) finds nothing unsafe: that must fail, not pass.
    return Row(
        "model loading never unpickles",
        f"{len(problems)} unsafe load(s) in {files} files",
        "0 in > 0 files",
        files > 0 and not problems,
        {"problems": problems, "files": files},
    )


def security(server, model_body, model, good_check=None):
    """With the production profile: no token or a made-up one -> refused; the key file's token -> served correctly;
    outside URL and oversized body refused. good_check(answer) -> True for a right answer (None: a JSON object)."""
    inference = f"{server.inference_url}/predictions/{model}"
    json_type = {"Content-Type": "application/json"}
    results = {}
    token_headers = server.headers("inference")
    results["inference_without_token"] = requests.post(
        inference, data=model_body, timeout=60, headers=json_type
    ).status_code
    results["inference_wrong_token"] = requests.post(
        inference, data=model_body, timeout=60, headers={**json_type, "Authorization": "Bearer not-a-key"}
    ).status_code
    served = requests.post(inference, data=model_body, timeout=60, headers={**json_type, **token_headers})
    results["inference_with_token"] = served.status_code
    anonymous, management = server.management(authorized=False), server.management()
    results["management_without_token"] = anonymous.request("GET", "/models").status_code
    results["management_with_token"] = management.request("GET", "/models").status_code
    outside = management.request(
        "POST", "/models", params={"url": "https://example.com/evil.mar", "model_name": "evil"}, timeout=60
    )
    results["register_outside_url"] = outside.status_code
    limit = int(server.props.get("max_request_size", 6553500))
    big = requests.post(inference, data=b"0" * (limit + 1024), timeout=60, headers={**json_type, **token_headers})
    results["oversized_body"] = big.status_code
    try:
        correct = served.status_code == 200 and bool(
            (good_check or (lambda a: isinstance(a, dict)))(strict_json(served.text))
        )
    except (ValueError, KeyError, TypeError, IndexError):
        correct = False
    # TorchServe 0.12 refuses a missing or wrong token with 400 ("Token Authorization failed ..."), not 401.
    refused = (400, 401, 403)
    reasons = []
    if not token_headers:
        reasons.append("no inference key in the server's key_file.json (is token authorization on?)")
    for key in ("inference_without_token", "inference_wrong_token", "management_without_token"):
        if results[key] not in refused:
            reasons.append(f"{key} answered {results[key]}")
    if not correct:
        reasons.append(f"with the token: {served.status_code} {served.text[:120]}")
    if results["management_with_token"] != 200:
        reasons.append(f"management with the token answered {results['management_with_token']}")
    if not 400 <= results["register_outside_url"] < 500:
        reasons.append(f"registering from an outside URL answered {results['register_outside_url']}")
    if results["oversized_body"] != 413:
        reasons.append(f"an oversized body answered {results['oversized_body']}")
    return Row(
        "production profile: tokens, allowed_urls, request size",
        ", ".join(f"{k}={v}" for k, v in results.items()) + (f" -- FAILED: {'; '.join(reasons)}" if reasons else ""),
        "refused without or with a wrong token, correct 200 with it, outside URL 4xx, oversized 413",
        not reasons,
        {**results, "answer_correct": correct, "reasons": reasons},
    )
