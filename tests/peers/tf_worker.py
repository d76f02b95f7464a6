"""One TensorFlow worker of the peer test: MultiWorkerMirroredStrategy from TF_CONFIG, a cross-worker all-reduce.

Each worker all-reduces (1, task index, node number) across the cluster that TF_CONFIG describes and writes
``$PEER_RESULTS/<task index>.json`` as rank_allreduce.py does.
"""

from __future__ import annotations

import json
import os
import sys

import tensorflow as tf
from labnode import lab_node


def main() -> int:
    config = json.loads(os.environ["TF_CONFIG"])
    index = config["task"]["index"]
    node = lab_node()
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    value = tf.constant([1.0, float(index), float(int(node.removeprefix("node")))])

    def step() -> tf.Tensor:
        return tf.distribute.get_replica_context().all_reduce(tf.distribute.ReduceOp.SUM, value)

    total = strategy.experimental_local_results(strategy.run(step))[0]
    record = {
        "rank": index,
        "world": strategy.num_replicas_in_sync,
        "node": node,
        "sum": [float(x) for x in total.numpy()],
        "env": {k: os.environ.get(k) for k in ("FT_JOB_ID", "FT_ATTEMPT", "PEER_MARK")},
    }
    path = os.path.join(os.environ["PEER_RESULTS"], f"{index}.json")
    with open(path + ".tmp", "w") as fh:
        json.dump(record, fh)
    os.replace(path + ".tmp", path)
    print(f"worker {index} on {node}: sum {record['sum']}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
