#!/bin/sh
# Runs ./train as 4 tasks on 2 nodes with srun alone, without gorun:
#
#   sh deploy/slurm/srun.sh [program arguments]
#
# inside an allocation (salloc -N 2 -n 4, or a batch script), or outside one
# (srun then asks for it). Every task calls collective.Init, which reads its
# rank from SLURM_PROCID, the job size from SLURM_NTASKS and its node's task
# count from SLURM_STEP_TASKS_PER_NODE. Rank 0 hosts the rendezvous on the
# first node of SLURM_STEP_NODELIST, at port
# 20000 + (SLURM_JOB_ID mod 1000)*10 + (SLURM_STEP_ID mod 10)
# (set GORUN_RENDEZVOUS_PORT to choose another), so that port must be open
# between the nodes.
set -eu

# A fresh job key for this run, in a file only you can read (Init refuses
# anything else), on a file system every node sees ($HOME).
umask 077
key_file=$(mktemp "$HOME/.gorun-job-key.XXXXXX")
trap 'rm -f "$key_file"' EXIT
od -An -tx1 -N32 /dev/urandom | tr -d ' \n' >"$key_file"
export GORUN_JOB_KEY_FILE="$key_file"

srun -N 2 -n 4 ./train "$@"
