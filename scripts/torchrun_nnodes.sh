#!/usr/bin/env bash
# torchrun on NNODES nodes x NPROC processes of the unchanged `distkit train`. Run the
# same line on every node, with the same MASTER_ADDR (a host every node can reach: it
# hosts the rendezvous) and JOB_ID. A crashed process makes every node stop and start
# again (up to MAX_RESTARTS times), resuming from the newest checkpoint.
#
# Usage (extra flags go to `distkit train`), on each of the 2 nodes:
#   NNODES=2 MASTER_ADDR=10.0.0.1 JOB_ID=job1 bash scripts/torchrun_nnodes.sh --epochs 20
#   NNODES=2 MASTER_ADDR=10.0.0.1 JOB_ID=job2 bash scripts/torchrun_nnodes.sh --task course:task
#   (a course's own Task, docs/course.md: course.py importable on every node)
#   NNODES=2 MASTER_ADDR=10.0.0.1 JOB_ID=job3 SCRIPT=train.py bash scripts/torchrun_nnodes.sh 10 5
#   (any script that makes its own process group, run by `distkit launch`: docs/launch.md)
# Two "nodes" on one machine: run it twice with MASTER_ADDR=127.0.0.1.
#
# Exact command (printed before it starts; DRY_RUN=1 prints it and stops):
#   TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 torchrun --nnodes=$NNODES --nproc_per_node=$NPROC --rdzv-backend=c10d --rdzv-endpoint=$MASTER_ADDR:$MASTER_PORT --rdzv-id=$JOB_ID --max-restarts=$MAX_RESTARTS -m distkit train --output-dir $OUTPUT_DIR --checkpoint-every $CHECKPOINT_EVERY --resume-from latest "$@"
# With SCRIPT set:
#   TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 torchrun --nnodes=$NNODES --nproc_per_node=$NPROC --rdzv-backend=c10d --rdzv-endpoint=$MASTER_ADDR:$MASTER_PORT --rdzv-id=$JOB_ID --max-restarts=$MAX_RESTARTS -m distkit launch $SCRIPT "$@"
#
# Why each part:
#   --rdzv-backend=c10d   nodes meet at MASTER_ADDR:MASTER_PORT and get their node ranks in
#                         order of arrival (no --node_rank to get wrong); after a failure
#                         they meet again in a new round
#   TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1
#                         a fresh store for each round (see torchrun_1node.sh)
#   OUTPUT_DIR            must be on a file system every node sees: rank 0 (on any node)
#                         writes the checkpoints, every rank reads the one it resumes from
# With static rendezvous instead (--node_rank=R --master_addr=A --master_port=P) a run
# works too (notebook 09 does it), but restarts are not safe.
set -euo pipefail
NNODES=${NNODES:-2}
NPROC=${NPROC:-1}
MASTER_ADDR=${MASTER_ADDR:?set MASTER_ADDR to the address of a host every node can reach}
MASTER_PORT=${MASTER_PORT:-29500}
JOB_ID=${JOB_ID:-distkit}
MAX_RESTARTS=${MAX_RESTARTS:-3}
CHECKPOINT_EVERY=${CHECKPOINT_EVERY:-50}
OUTPUT_DIR=${OUTPUT_DIR:-runs/$JOB_ID}

cmd=(torchrun --nnodes="$NNODES" --nproc_per_node="$NPROC" --rdzv-backend=c10d
     --rdzv-endpoint="$MASTER_ADDR:$MASTER_PORT" --rdzv-id="$JOB_ID" --max-restarts="$MAX_RESTARTS")
if [[ -n "${SCRIPT:-}" ]]; then  # distkit launch: one line naming a failed rank and file:line
  cmd+=(-m distkit launch "$SCRIPT" "$@")
else
  cmd+=(-m distkit train --output-dir "$OUTPUT_DIR" --checkpoint-every "$CHECKPOINT_EVERY"
        --resume-from latest "$@")
fi
echo "+ TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 ${cmd[*]}"
[[ "${DRY_RUN:-0}" == 1 ]] && exit 0
export TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1
exec "${cmd[@]}"
