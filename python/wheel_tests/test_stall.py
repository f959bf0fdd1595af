"""The data stall, measured by the client and shown by the daemon: a loop that computes 50 ms
per batch waits little, a loop that does nothing waits almost all the time."""

import json
import re
import socket
import subprocess
import sys
import time
import urllib.request

from conftest import run_py, status_json, user_socket

CLIENT = """
import json, sys, time, stoker
loader = stoker.Loader({data!r}, batch_size={batch}, crop={crop}, seed=0, job={job!r})
it = loader.batches()
# At least n batches and at least 1.5 s: the client reports to the daemon every 0.5 s from
# inside next(), so a loop shorter than that would have nothing to show there.
start, done = time.monotonic(), 0
while done < {n} or time.monotonic() - start < 1.5:
    batch = next(it)
    del batch
    time.sleep({sleep})
    done += 1
s = loader.stats()
print(json.dumps(s), flush=True)
sys.stdin.readline()  # stay attached while the test looks at the daemon
loader.close()
"""


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_client(env, dataset, job, sleep, n, batch=4, crop=32):
    code = CLIENT.format(data=str(dataset), job=job, sleep=sleep, n=n, batch=batch, crop=crop)
    p = subprocess.Popen([sys.executable, "-c", code], env=env, stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    return p


def test_status_and_metrics_show_a_low_and_a_high_wait_fraction(env, dataset):
    port = free_port()
    env = dict(env, STOKER_DAEMON_ARGS=f"--metrics-listen 127.0.0.1:{port} --threads 2")
    # Start the daemon first, so both loops measure steady serving, not its start.
    warm = run_py(f"import stoker; len(stoker.Loader({str(dataset)!r}, batch_size=4, crop=32))",
                  env)
    assert warm.returncode == 0, warm.stderr
    compute = start_client(env, dataset, "compute-bound", 0.05, 30)
    # The input-bound loop takes larger batches of 224x224 images so that the daemon's work,
    # not the loop's Python, sets its pace.
    tight = start_client(env, dataset, "input-bound", 0.0, 150, batch=16, crop=224)
    got = {}
    for name, p in (("compute-bound", compute), ("input-bound", tight)):
        line = p.stdout.readline()
        assert line, p.stderr.read()
        got[name] = json.loads(line)
    # Client side: loader.stats().
    assert got["compute-bound"]["wait_fraction"] < 0.3, got
    assert got["input-bound"]["wait_fraction"] > 0.7, got
    assert got["compute-bound"]["compute_s"] >= 29 * 0.05
    # The daemon's side: the last report arrives within STATS_EVERY (0.5 s) of a next().
    # Each loop reported during its run; the figures shown are its recent wait fraction.
    status = status_json(env, user_socket(env))
    stalls = {j["job"]: j["stalls"] for j in status["jobs"]}
    [low] = stalls["compute-bound"]
    [high] = stalls["input-bound"]
    assert low["rank"] == 0 and low["batches"] > 0
    assert low["wait_fraction"] < 0.3, stalls
    assert high["wait_fraction"] > 0.7, stalls
    text = subprocess.run(["stoker", "status"], env=env, capture_output=True, text=True,
                          timeout=30).stdout
    assert re.search(r"compute-bound \(root\) rank 0: wait \d+%", text), text
    assert re.search(r"input-bound \(root\) rank 0: wait \d+%", text), text
    metrics = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read()
    metrics = metrics.decode()

    def sample(job):
        m = re.search(r'^stoker_client_wait_fraction\{job="%s",rank="0",uid="\d+"\} (\S+)$' % job,
                      metrics, re.M)
        assert m, metrics
        return float(m.group(1))

    assert sample("compute-bound") < 0.3
    assert sample("input-bound") > 0.7
    for p in (compute, tight):
        p.stdin.write("\n")
        p.stdin.flush()
        p.wait(timeout=30)
        assert p.returncode == 0, p.stderr.read()
    # Detached ranks leave no series behind.
    time.sleep(0.2)
    after = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read()
    assert b'job="compute-bound"' not in after
