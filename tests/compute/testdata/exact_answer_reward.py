#!/usr/bin/env python3
"""Reward program for the `loradb train --data --reward-cmd` tests: reads rollouts as JSON lines
on stdin and writes 1 when the completion's first token is the line's "answer", else 0."""
import json
import sys

for line in sys.stdin:
    rollout = json.loads(line)
    completion = rollout["completion_ids"]
    print(1.0 if completion and completion[0] == rollout["example"]["answer"] else 0.0, flush=True)
