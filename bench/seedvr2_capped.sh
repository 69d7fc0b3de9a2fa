#!/usr/bin/env bash
# SeedVR2 on smaller cards (issue 31), one phase per device call (each fits the device's 10-minute call):
#
#   bash bench/seedvr2_capped.sh smoke OUT      21 frames, 12 GiB: the capped path runs at all (seconds)
#   bash bench/seedvr2_capped.sh whole OUT      10-s 1344x768 -> 1920x1080, 3B bf16, the whole card: the baseline
#   bash bench/seedvr2_capped.sh cap24 OUT      the same clip in 24 GiB (streamed blocks, automatic tiles), then the
#                                               whole card again with the 24-GiB run's batch and tiles: streaming's
#                                               bitwise equality (the baseline's own batch and tiles differ)
#   bash bench/seedvr2_capped.sh cap12 OUT      the same clip in 12 GiB, then a DiT step at the 10-s x2 shape,
#                                               bf16 then FP8 GEMMs
#   bash bench/seedvr2_capped.sh 7b OUT         the same clip on 7B in 24 GiB
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
whole)
    bench pipeline "${clip[@]}" ;;
cap24)
    bench pipeline "${clip[@]}" --memory-gib 24 --resident-blocks auto --save /tmp/cap24.pt
    batch=$(last 'r["batch_frames"]') tiles=$(last '" ".join(map(str, r["vae_tiles"]))')
    # shellcheck disable=SC2086  # two tile sizes, encode and decode
    bench pipeline "${clip[@]}" --batch-frames "$batch" --vae-tile $tiles --compare /tmp/cap24.pt ;;
cap12)
    bench pipeline "${clip[@]}" --memory-gib 12 --resident-blocks auto
    bench dit --fp8 --iters 1 ;;
7b)
    bench pipeline "${clip[@]}" --variant 7b --memory-gib 24 --resident-blocks auto ;;
*)
    echo "phase: smoke, whole, cap24, cap12 or 7b" >&2; exit 2 ;;
esac
