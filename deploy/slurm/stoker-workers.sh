#!/usr/bin/env bash
# Remote CPU workers for a Slurm heterogeneous job (deploy/slurm/train-workers.sbatch): the
# GPU component's per-node daemons send units of work to stokerd workers on the CPU
# component's nodes (docs/multi-host.md, "Remote CPU workers").
#
#   deploy/slurm/stoker-workers.sh setup     # once, in the batch script: prints the home config
#   srun --het-group=1 --ntasks-per-node=1 --overlap deploy/slurm/stoker-workers.sh worker &
#   deploy/slurm/stoker-workers.sh cleanup   # at the end of the batch script
#
# `setup` makes the job's shared folder (mode 0700, on a filesystem every node of the job
# sees: $STOKER_SHARED_DIR, by default $HOME/.stoker/job-$SLURM_JOB_ID) with a fresh secret
# (0600), the workers' config and the home daemons' config, which lists every node of the
# CPU component (`scontrol show hostnames $SLURM_JOB_NODELIST_HET_GROUP_1`, or the names in
# $STOKER_WORKER_HOSTS) at $STOKER_WORKER_PORT; it prints the home config's path, for
# STOKER_CONFIG of deploy/slurm/stokerd-job.sh. `worker` runs one worker on this node, on a
# socket of its own under ${TMPDIR:-/tmp}, until Slurm ends the step.
#
# Environment: STOKER_DATASET_ROOTS (folders, ':'-separated, under which the job's datasets
# lie: the same paths on both components; required), STOKER_WORKER_PORT (default 20000 +
# the job id mod 20000, so that two jobs on one node rarely meet), STOKER_SHARED_DIR,
# STOKER_WORKER_HOSTS, STOKERD (the binary, default `stokerd` on PATH).
set -euo pipefail
set -f # no globbing of host names or folders
job=${SLURM_JOB_ID:?SLURM_JOB_ID is unset: run inside a Slurm job}
shared=${STOKER_SHARED_DIR:-$HOME/.stoker/job-$job}
port=${STOKER_WORKER_PORT:-$((20000 + job % 20000))}

toml_safe() { # refuses a value that would need escaping in a TOML string
    if [[ $1 == *[\"\\]* || $1 == *[[:cntrl:]]* ]]; then
        echo "stoker-workers.sh: $2 ${1@Q} holds a quote, backslash or control character" >&2
        exit 64
    fi
}

toml_list() { # "a:b" -> ["a", "b"]
    local IFS=: out="" item
    for item in $1; do toml_safe "$item" "dataset root"; out+="${out:+, }\"$item\""; done
    echo "[$out]"
}

setup() {
    : "${STOKER_DATASET_ROOTS:?set STOKER_DATASET_ROOTS to the folders holding the datasets}"
    local hosts=${STOKER_WORKER_HOSTS:-}
    if [[ -z $hosts ]]; then
        local nodes=${SLURM_JOB_NODELIST_HET_GROUP_1:?no CPU component: submit a heterogeneous job (hetjob) or set STOKER_WORKER_HOSTS}
        hosts=$(scontrol show hostnames "$nodes" | paste -sd: -)
    fi
    toml_safe "$shared" "shared folder"
    (umask 077 && mkdir -p "$shared")
    chmod 0700 "$shared"
    if [[ ! -e $shared/worker.secret ]]; then
        (umask 077 && head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' > "$shared/worker.secret")
    fi
    cat > "$shared/worker.toml" <<TOML
[access]
dataset_roots = $(toml_list "$STOKER_DATASET_ROOTS")
[worker]
listen = "0.0.0.0:$port"
secret_file = "$shared/worker.secret"
TOML
    local workers="" h
    local IFS=:
    for h in $hosts; do toml_safe "$h" "host"; workers+="${workers:+, }\"$h:$port\""; done
    unset IFS
    cat > "$shared/home.toml" <<TOML
[remote]
workers = [$workers]
secret_file = "$shared/worker.secret"
TOML
    echo "$shared/home.toml"
}

worker() {
    [[ -r $shared/worker.toml ]] || { echo "stoker-workers.sh: no $shared/worker.toml: run 'setup' first" >&2; exit 78; }
    local dir=${TMPDIR:-/tmp}/stoker-worker-$job
    mkdir -p "$dir"
    chmod 0700 "$dir"
    export XDG_CACHE_HOME=${XDG_CACHE_HOME:-$dir/cache}
    "${STOKERD:-stokerd}" --config "$shared/worker.toml" --socket "$dir/stoker.sock" "$@" &
    pid=$!
    trap 'stop "$dir"' TERM INT
    local rc=0
    wait "$pid" || rc=$?
    # The daemon exited on its own (a config error is 78): clean up and report its status.
    rm -rf "$dir"
    exit "$rc"
}

stop() { # Slurm ends the step: the daemon drains; its exit status is the step's.
    kill -TERM "$pid" 2>/dev/null || true
    local rc=0
    wait "$pid" || rc=$?
    rm -rf "$1"
    exit "$rc"
}

case ${1:-} in
    setup) setup ;;
    worker) shift; worker "$@" ;;
    cleanup) rm -rf "$shared" ;;
    *) echo "usage: stoker-workers.sh setup|worker|cleanup" >&2; exit 64 ;;
esac
