"""The multi-worker custom-training-loop tutorial's per-worker script, as people publish
it: it reads its TF_CONFIG (os.environ['TF_CONFIG'], a KeyError without it, as the
tutorial's does), builds MultiWorkerMirroredStrategy and trains with strategy.run in a
tf.function over a distributed dataset batched per the cluster's size, printing each
step's loss. Synthetic data in place of MNIST's download. It knows nothing of gpuwatch.
(Keras 3's fit under MultiWorkerMirroredStrategy fails here with or without gpuwatch:
"Attempt to convert a value (PerReplica...) to a Tensor".)
"""

import argparse
import json
import os

import numpy as np

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=20)
parser.add_argument("--per-worker-batch", type=int, default=32)
parser.add_argument("--resolver", choices=["tf-config", "slurm"], default="tf-config",
                    help="slurm: the cluster from Slurm's step (SlurmClusterResolver, srun)")
parser.add_argument("--port-base", type=int, default=8888, help="slurm: the first port")
args = parser.parse_args()

if args.resolver == "tf-config":
    tf_config = json.loads(os.environ["TF_CONFIG"])
    num_workers = len(tf_config["cluster"]["worker"])
    task = tf_config["task"]["index"]

import keras  # noqa: E402
import tensorflow as tf  # noqa: E402

if args.resolver == "slurm":
    # Its GPU count given (it would ask nvidia-smi) and at least one slot a task: the
    # resolver divides by it. No GPU here; it leaves CUDA_VISIBLE_DEVICES alone.
    tasks_here = max(int(n.split("(")[0])
                     for n in os.environ["SLURM_STEP_TASKS_PER_NODE"].split(","))
    slots = max(len(tf.config.list_physical_devices("GPU")), tasks_here)
    resolver = tf.distribute.cluster_resolver.SlurmClusterResolver(
        port_base=args.port_base, gpus_per_node=slots, gpus_per_task=slots // tasks_here,
        auto_set_gpu=False)
    num_workers = resolver.cluster_spec().num_tasks("worker")
    task = resolver.task_id
    print(f"worker {task} of {num_workers}: {resolver.cluster_spec().as_dict()}", flush=True)
    strategy = tf.distribute.MultiWorkerMirroredStrategy(cluster_resolver=resolver)
else:
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
global_batch_size = args.per_worker_batch * num_workers

rng = np.random.default_rng(0)
x = rng.normal(size=(global_batch_size * 16, 28, 28)).astype("float32")  # repeated
y = rng.integers(0, 10, size=(global_batch_size * 16,)).astype("int64")
dataset = tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(global_batch_size)
options = tf.data.Options()
options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
dist_dataset = strategy.experimental_distribute_dataset(dataset.with_options(options))

with strategy.scope():
    model = keras.Sequential([
        keras.Input(shape=(28, 28)),
        keras.layers.Flatten(),
        keras.layers.Dense(64, activation="relu"),
        keras.layers.Dense(10),
    ])
    optimizer = keras.optimizers.SGD(learning_rate=0.01)
    optimizer.build(model.trainable_variables)
    loss_object = keras.losses.SparseCategoricalCrossentropy(from_logits=True,
                                                             reduction="none")


@tf.function
def train_step(iterator):
    def step_fn(inputs):
        features, labels = inputs
        with tf.GradientTape() as tape:
            per_example = loss_object(labels, model(features, training=True))
            loss = tf.nn.compute_average_loss(per_example, global_batch_size=global_batch_size)
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))
        return loss

    per_replica = strategy.run(step_fn, args=(next(iterator),))
    return strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica, axis=None)


iterator = iter(dist_dataset)
for step in range(1, args.steps + 1):
    loss = train_step(iterator)
    print(f"worker {task} step {step} loss {float(loss):.6f}", flush=True)
print(f"worker {task} trained", flush=True)
