"""Property-based fuzzing of `loradb serve` from its own /openapi.json with schemathesis: no 5xx,
responses (status, content type, body) match the document. Bounded number of examples."""
import os
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import http_harness  # noqa: E402

MAX_EXAMPLES = os.environ.get("LORADB_SCHEMATHESIS_EXAMPLES", "20")


def main():
    args = http_harness.parse_args()
    exe = shutil.which("schemathesis") or shutil.which("st")
    if exe is None:
        print("SKIP: schemathesis is not installed (tools/dev setup installs it)")
        return 77
    store = http_harness.Store(args.seed, policies=2, revisions=3)
    server = http_harness.Server(args.cli, store.dir, "--token-file", store.token_file)
    try:
        cmd = [exe, "run", server.url("/openapi.json"),
               "-H", "Authorization: Bearer " + http_harness.TOKEN,
               "--checks", "not_a_server_error,status_code_conformance,"
                           "content_type_conformance,response_schema_conformance",
               "--max-examples", MAX_EXAMPLES, "--seed", "20261129",
               # One worker: with two, CPython 3.11's ast.parse (used by hypothesis) raised
               # "AST constructor recursion depth mismatch" inside schemathesis.
               "--phases", "examples,coverage,fuzzing", "--workers", "1",
               "--generation-database", "none", "--request-timeout", "30",
               "--suppress-health-check", "filter_too_much",
               "--no-color", "--report-dir", os.path.join(store.tmp.name, "report")]
        print("+", " ".join(cmd), flush=True)
        rc = subprocess.run(cmd, timeout=540).returncode
    finally:
        stop_rc = server.stop()
        store.close()
    if stop_rc != 0:
        print(f"server exited with {stop_rc}")
        return 1
    return rc


if __name__ == "__main__":
    sys.exit(main())
