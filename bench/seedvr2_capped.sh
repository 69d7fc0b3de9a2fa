#!/usr/bin/env bash
# SeedVR2 on smaller cards (issue 31), one phase per device call (each fits the device's 10-minute call):
#
#   bash bench/seedvr2_capped.sh smoke OUT      21 frames, 12 GiB: the capped path runs at all (seconds)
#   bash bench/seedvr2_capped.sh cap24 OUT      10-s 1344x768 -> 1920x1080, 3B bf16: the whole card, then 24 GiB
#                                               (streamed blocks, automatic tiles), then the whole card again with
#                                               the 24-GiB run's batch and tiles (bitwise equality of streaming)
#   bash bench/seedvr2_capped.sh cap12 OUT      the same clip in 12 GiB, and 7B in 24 GiB
#   bash bench/seedvr2_capped.sh fp8 OUT        a DiT step at the 10-s x2 shape, bf16 then FP8 GEMMs
#
# Every run appends its JSON line to OUT/seedvr2_capped.jsonl; frames saved for comparisons stay in /tmp.
set -euo pipefail
cd "$(dirname "$0")/.."
phase=$1 out=$2
log=$out/seedvr2_capped.jsonl
clip=(--frames 241 --height 768 --width 1344 --size 1920x1080)
bench() { python bench/seedvr2.py "$@" --json "$log"; }
last() { tail -1 "$log" | python -c "import json,sys; r=json.load(sys.stdin); print($1)"; }

case $phase in
smoke)
    bench pipeline --frames 21 --height 768 --width 1344 --size 1920x1080 --memory-gib 12 --resident-blocks auto ;;
cap24)
    bench pipeline "${clip[@]}" --save /tmp/whole.pt
    bench pipeline "${clip[@]}" --memory-gib 24 --resident-blocks auto --save /tmp/cap24.pt --compare /tmp/whole.pt
    batch=$(last 'r["batch_frames"]') tiles=$(last '" ".join(map(str, r["vae_tiles"]))')
    # shellcheck disable=SC2086  # two tile sizes, encode and decode
    bench pipeline "${clip[@]}" --batch-frames "$batch" --vae-tile $tiles --compare /tmp/cap24.pt ;;
cap12)
    bench pipeline "${clip[@]}" --memory-gib 12 --resident-blocks auto
    bench pipeline "${clip[@]}" --variant 7b --memory-gib 24 --resident-blocks auto ;;
fp8)
    bench dit --fp8 --iters 1 ;;
*)
    echo "phase: smoke, cap24, cap12 or fp8" >&2; exit 2 ;;
esac
