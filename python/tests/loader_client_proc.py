"""One rank of a stoker job in a process of its own, iterating a `stoker.Loader` as a training
loop does (`for images, labels in loader`, epoch after epoch), for tests that interrupt it or
restart its daemon.

argv[1] is a JSON object:
- socket, dataset, job, rank, world_size, seed, batch_size, crop: the Loader's;
- batches: how many batches to take; out: a file getting one JSON line per batch
  (epoch, step, indices, labels, sha1 of the images' and labels' bytes), plus
  {"interrupted": state_dict} each time a KeyboardInterrupt was caught;
- interrupt_after (optional): after that many batches, hold every slot of the ring so that the
  next `next()` waits, send this process SIGINT while it waits, then let one slot go, so the
  daemon fills it and `next()` returns into the pending KeyboardInterrupt (a notebook's Ctrl-C);
- hold_after + gate (optional): after that many batches, create out + ".held" and wait until
  the file `gate` exists before asking for the next batch (the test restarts the daemon then).
Exits 0 once it has its batches.
"""

import hashlib
import json
import signal
import sys
import threading
import time
from pathlib import Path

import numpy as np

import stoker


def record(b):
    images = np.from_dlpack(b.images)
    labels = np.from_dlpack(b.labels)
    digest = hashlib.sha1(images.tobytes() + labels.tobytes()).hexdigest()
    return {"epoch": b.epoch, "step": b.step, "indices": np.from_dlpack(b.indices).tolist(),
            "labels": labels.tolist(), "sha1": digest}


def interrupt_while_waiting(held, main):
    """SIGINT to the main thread while it waits in next() (every slot is held), then frees the
    slots so that the daemon publishes the next batch."""
    time.sleep(0.3)
    signal.pthread_kill(main, signal.SIGINT)
    time.sleep(0.2)
    held.clear()


def main():
    o = json.loads(sys.argv[1])
    ld = stoker.Loader(o["dataset"], batch_size=o["batch_size"], crop=o["crop"],
                       socket=o["socket"], job=o["job"], rank=o["rank"],
                       world_size=o["world_size"], seed=o["seed"])
    out = open(o["out"], "w")
    slots = ld.info["slots"]
    interrupt_after, hold_after = o.get("interrupt_after"), o.get("hold_after")
    taken, held = 0, []
    while taken < o["batches"]:
        try:
            for images, labels in ld:
                b = images.batch
                out.write(json.dumps(record(b)) + "\n")
                out.flush()
                taken += 1
                if interrupt_after is not None and 0 <= interrupt_after - taken < slots:
                    held.append(b)
                if taken == interrupt_after:
                    threading.Thread(target=interrupt_while_waiting,
                                     args=(held, threading.main_thread().ident)).start()
                if taken == hold_after:
                    Path(o["out"] + ".held").touch()
                    while not Path(o["gate"]).exists():
                        time.sleep(0.01)
                del b, images, labels
                if taken == o["batches"]:
                    break
        except KeyboardInterrupt:
            out.write(json.dumps({"interrupted": ld.state_dict()}) + "\n")
            out.flush()
    ld.close()


if __name__ == "__main__":
    main()
