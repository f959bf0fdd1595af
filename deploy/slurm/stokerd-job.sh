#!/usr/bin/env bash
# One stokerd for this Slurm job on this node, on a socket of its own, started by the job:
#
#   srun --ntasks-per-node=1 --overlap deploy/slurm/stokerd-job.sh &
#   export STOKER_SOCKET=$(deploy/slurm/stokerd-job.sh --print-socket)
#
# (see deploy/slurm/train.sbatch and docs/multi-host.md). The socket is
# $STOKER_JOB_DIR/stoker.sock, by default ${TMPDIR:-/tmp}/stoker-job-$SLURM_JOB_ID: the same path
# on every node, private to the job (folder mode 0700). Clients retry connecting for
# $STOKER_CONNECT_TIMEOUT seconds (10 by default), so ranks may start before the daemon
# listens. When Slurm ends the step (job end, scancel: SIGTERM, later SIGKILL) the daemon
# drains and the folder is removed.
#
# Environment: STOKERD (the binary, default `stokerd` on PATH), STOKER_CONFIG (a stoker.toml
# for --config), STOKER_JOB_DIR (the folder). Extra arguments go to stokerd.
set -euo pipefail
dir=${STOKER_JOB_DIR:-${TMPDIR:-/tmp}/stoker-job-${SLURM_JOB_ID:?SLURM_JOB_ID is unset: run inside a Slurm job, or set STOKER_JOB_DIR}}
if [[ ${1:-} == --print-socket ]]; then
    echo "$dir/stoker.sock"
    exit 0
fi
mkdir -p "$dir"
chmod 0700 "$dir"
args=(--socket "$dir/stoker.sock")
[[ -n ${STOKER_CONFIG:-} ]] && args+=(--config "$STOKER_CONFIG")
# The node cache of this job (a site-wide daemon under systemd shares one across jobs).
export XDG_CACHE_HOME=${XDG_CACHE_HOME:-$dir/cache}
"${STOKERD:-stokerd}" "${args[@]}" "$@" &
pid=$!
stop() {
    kill -TERM "$pid" 2>/dev/null || true
    local rc=0
    wait "$pid" || rc=$?
    rm -rf "$dir"
    exit "$rc"
}
trap stop TERM INT
set +e
wait "$pid"
rc=$?
set -e
# The daemon exited on its own (a config error is 78): clean up and report its status.
rm -rf "$dir"
exit "$rc"
