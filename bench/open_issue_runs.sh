#!/usr/bin/env bash
# The GPU measurements the open issues still need, one phase per device call (each fits the device's 10-minute
# call; run from the repository root with the device wheels installed, as docs/BENCHMARKS.md's runs were):
#
#   bash bench/open_issue_runs.sh upscale OUT    issue 29: the 10-s x2 SeedVR2 upscale twice (needs an H200: 78 GiB)
#   bash bench/open_issue_runs.sh pieces OUT     issue 31: the VAE's full-rate layers in pieces of 1 and 2 frames vs
#                                                whole slices at the 10-s 1080p shape: stage peaks and times (the
#                                                memory model's calibration before the planner may choose pieces)
#   bash bench/open_issue_runs.sh sage OUT       issue 33: the SAGE GPU tests (the quantisers' bitwise test first:
#                                                it decides sage_kernel.TRITON_QUANTISERS), the dense kernel and VSA
#                                                at sage precision at the 10-s shape (block and attention vs dense)
#   bash bench/open_issue_runs.sh refine OUT     issue 35: H3 Refine at 10 s (VSA: dense does not fit one call) and
#                                                SeedVR2 x1.43 of the same clip
#
# Every run appends its JSON lines under OUT.
set -euo pipefail
cd "$(dirname "$0")/.."
phase=$1 out=$2
mkdir -p "$out"
case $phase in
upscale)
    for run in 1 2; do python bench/seedvr2.py pipeline --json "$out/upscale.jsonl"; done ;;
pieces)
    for pieces in 0 1 2; do
        python bench/seedvr2.py pipeline --frames 241 --size 1920x1088 --vae-piece-frames "$pieces" \
            --json "$out/pieces.jsonl"
    done ;;
sage)
    python -m pytest -q tests/attention/test_sage.py tests/attention/test_vsa_sage.py 2>&1 | tail -5
    python bench/sage_attention.py --no-sweep --json "$out/sage.json"
    python bench/vsa.py --seconds 10 --compile --fp8 --sage --skip-diffusers --iters 5 --json "$out/vsa_sage.json" ;;
refine)
    python bench/refine.py --seconds 10 --attention vsa --json "$out/refine10.json"
    python bench/seedvr2.py pipeline --frames 241 --scale 1.43 --json "$out/sv241.jsonl" ;;
*)
    echo "phase: upscale, pieces, sage or refine" >&2; exit 2 ;;
esac
