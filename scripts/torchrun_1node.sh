#!/usr/bin/env bash
# torchrun on one node: NPROC processes of the unchanged `distkit train`; a crashed
# process makes torchrun stop the others and start them again (up to MAX_RESTARTS
# times), and the new start resumes from the newest checkpoint, losing at most the
# CHECKPOINT_EVERY iterations since it.
#
# Usage (extra flags go to `distkit train`):
#   bash scripts/torchrun_1node.sh
#   NPROC=4 MAX_RESTARTS=3 OUTPUT_DIR=runs/job1 bash scripts/torchrun_1node.sh --epochs 20
#   bash scripts/torchrun_1node.sh --task course:task   # a course's own Task (docs/course.md)
#   SCRIPT=train.py bash scripts/torchrun_1node.sh 10 5  # any script that makes its own
#                        # process group (torchrun-style), run by `distkit launch` (docs/launch.md)
#
# Exact command (printed before it starts; DRY_RUN=1 prints it and stops):
#   TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 torchrun --standalone --nproc_per_node=$NPROC --max-restarts=$MAX_RESTARTS -m distkit train --output-dir $OUTPUT_DIR --checkpoint-every $CHECKPOINT_EVERY --resume-from latest "$@"
# With SCRIPT set (the script resumes from its own snapshots, if it keeps any):
#   TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 torchrun --standalone --nproc_per_node=$NPROC --max-restarts=$MAX_RESTARTS -m distkit launch $SCRIPT "$@"
#
# Why each part:
#   --standalone          c10d rendezvous on a free local port: no port to choose, no clash
#   TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1
#                         a fresh store for each restart; with one shared store a restarted
#                         process can read the dead attempt's addresses and fail to connect
#                         (torch 2.15: 4 of 8 restarts failed so; see distkit.lessons.failure).
#                         distkit train no longer needs it on one node (each attempt meets
#                         under its own prefix: docs/resume.md); a SCRIPT makes its own group
#                         and does
#   --resume-from latest  newest checkpoint under OUTPUT_DIR, or from scratch if none:
#                         one command for the first start and every restart
#   OUTPUT_DIR            one per job (default: a new one per invocation); to resume a job
#                         that ended (e.g. out of restarts), run again with its OUTPUT_DIR
set -euo pipefail
NPROC=${NPROC:-2}
MAX_RESTARTS=${MAX_RESTARTS:-3}
CHECKPOINT_EVERY=${CHECKPOINT_EVERY:-50}
OUTPUT_DIR=${OUTPUT_DIR:-runs/torchrun-$(date +%Y%m%d-%H%M%S)}

if [[ -n "${SCRIPT:-}" ]]; then  # distkit launch: one line naming a failed rank and file:line
  cmd=(torchrun --standalone --nproc_per_node="$NPROC" --max-restarts="$MAX_RESTARTS"
       -m distkit launch "$SCRIPT" "$@")
else
  cmd=(torchrun --standalone --nproc_per_node="$NPROC" --max-restarts="$MAX_RESTARTS"
       -m distkit train --output-dir "$OUTPUT_DIR" --checkpoint-every "$CHECKPOINT_EVERY"
       --resume-from latest "$@")
fi
echo "+ TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 ${cmd[*]}"
[[ "${DRY_RUN:-0}" == 1 ]] && exit 0
export TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1
exec "${cmd[@]}"
