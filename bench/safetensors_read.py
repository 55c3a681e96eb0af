"""Times PyPI safetensors reading one file, for `loradb-bench tiers moe-load`.

Usage: python3 bench/safetensors_read.py PATH REPS COLD

Each of REPS repetitions opens PATH with safe_open (framework "pt") and reads every tensor with
get_tensor, timed from before safe_open to after the last tensor (interpreter start and
`import torch` are not timed). COLD=1 drops the page cache before each repetition (needs root;
"dropped" in the output says whether it could), as the C++ side does. Prints one JSON object:
open_s and read_s (the fastest repetition), first_read_s (the first), tensors, dropped.
"""
import json
import os
import sys
import time

import torch  # noqa: F401  (safetensors' "pt" framework; imported before timing starts)
from safetensors import safe_open


def drop_page_cache():
    os.sync()
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3")
        return True
    except OSError:
        return False


def main():
    path, reps, cold = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "1"
    opens, reads, n, dropped = [], [], 0, cold
    for _ in range(reps):
        if cold:
            dropped = drop_page_cache() and dropped
        t0 = time.perf_counter()
        n = 0
        with safe_open(path, framework="pt") as f:
            t1 = time.perf_counter()
            for k in f.keys():
                f.get_tensor(k)
                n += 1
        t2 = time.perf_counter()
        opens.append(t1 - t0)
        reads.append(t2 - t0)
    print(json.dumps({"open_s": min(opens), "read_s": min(reads), "first_read_s": reads[0],
                      "tensors": n, "dropped": dropped}))


if __name__ == "__main__":
    main()
