"""A person's own custom training loop, as TensorFlow's distributed-training guide writes
it: strategy.run of a replica step inside a tf.function (or eagerly with --eager), the
loss reduced with strategy.reduce and printed each step. It knows nothing of gpuwatch.
"""

import argparse
import sys
import time

import numpy as np

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=20)
parser.add_argument("--batch", type=int, default=64, help="global batch")
parser.add_argument("--eager", action="store_true", help="no tf.function")
parser.add_argument("--read-ms", type=float, default=0.0, help="host cost of each batch")
parser.add_argument("--burst", type=int, default=1,
                    help="every Nth batch costs N x read-ms, the others nothing")
parser.add_argument("--no-read-ahead", action="store_true",
                    help="turn off tf.data's read-ahead (its injected prefetch and its autotuner, "
                         "which reads ahead without it): a batch is read when the step asks")
parser.add_argument("--width", type=int, default=64, help="hidden units (compute per step)")
parser.add_argument("--raise-at", type=int, default=0, help="raise an error at this step")
parser.add_argument("--no-strategy", action="store_true", help="plain tf.function, no strategy")
parser.add_argument("--strategy", choices=["mirrored", "one-device", "multi-worker"],
                    default="mirrored", help="which tf.distribute strategy")
parser.add_argument("--from-function", action="store_true",
                    help="distribute_datasets_from_function (no read-ahead buffer of its own)")
parser.add_argument("--python-next", action="store_true",
                    help="the distributed-training tutorial's loop: `for x in dist_dataset`, "
                         "each batch passed to the tf.function step")
parser.add_argument("--restored", type=int, default=0,
                    help="the optimizer's iterations as a restored checkpoint left them")
parser.add_argument("--tensors", action="store_true",
                    help="each step passed tensors the script slices itself (no dataset)")
args = parser.parse_args()

import tensorflow as tf  # noqa: E402

cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
import keras  # noqa: E402

keras.utils.set_random_seed(0)
if args.no_strategy:
    strategy = tf.distribute.get_strategy()
elif args.strategy == "one-device":
    strategy = tf.distribute.OneDeviceStrategy("/cpu:0")
elif args.strategy == "multi-worker":  # no TF_CONFIG: one worker, this host's devices
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
else:
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])

rng = np.random.default_rng(0)
examples = args.batch * (args.steps + 2)
x = rng.normal(size=(examples, 32)).astype("float32")
y = rng.integers(0, 10, size=(examples,)).astype("int64")


def read(i):
    index = int(i)
    if args.read_ms and index % args.burst == 0:
        time.sleep(args.read_ms * args.burst / 1000.0)
    return i




def batches(batch: int) -> tf.data.Dataset:
    data = tf.data.Dataset.from_tensor_slices((x, y)).batch(batch)
    if args.read_ms:
        data = data.enumerate().map(
            lambda i, b: (tf.py_function(read, [i], tf.int64), b)).map(lambda i, b: b)
    if args.no_read_ahead:
        options = tf.data.Options()
        options.experimental_optimization.inject_prefetch = False
        options.autotune.enabled = False
        data = data.with_options(options)
    return data


with strategy.scope():
    model = keras.Sequential([
        keras.Input((32,)),
        keras.layers.Dense(args.width, activation="relu"),
        keras.layers.Dense(args.width, activation="relu"),
        keras.layers.Dense(10),
    ])
    optimizer = keras.optimizers.SGD(0.05)
    optimizer.build(model.trainable_variables)
    if args.restored:
        optimizer.iterations.assign(args.restored)
    loss_object = keras.losses.SparseCategoricalCrossentropy(
        from_logits=True, reduction="none")

if args.from_function:
    # Each replica reads its own half of every global batch.
    def replica_data(context: tf.distribute.InputContext) -> tf.data.Dataset:
        batch = context.get_per_replica_batch_size(args.batch)
        return batches(batch).shard(context.num_input_pipelines, context.input_pipeline_id)

    dist_data = strategy.distribute_datasets_from_function(replica_data)
else:
    dist_data = strategy.experimental_distribute_dataset(batches(args.batch))


def step_fn(inputs):
    features, labels = inputs
    with tf.GradientTape() as tape:
        logits = model(features, training=True)
        per_example = loss_object(labels, logits)
        loss = tf.nn.compute_average_loss(per_example, global_batch_size=args.batch)
    grads = tape.gradient(loss, model.trainable_variables)
    optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=False))
    return loss


def train_step(iterator):
    per_replica = strategy.run(step_fn, args=(next(iterator),))
    return strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica, axis=None)


def distributed_train_step(dist_inputs):
    per_replica = strategy.run(step_fn, args=(dist_inputs,))
    return strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica, axis=None)


if not args.eager:
    train_step = tf.function(train_step)
    distributed_train_step = tf.function(distributed_train_step)

if args.tensors:
    for step in range(1, args.steps + 1):
        rows = slice((step - 1) * args.batch, step * args.batch)
        loss = distributed_train_step((tf.constant(x[rows]), tf.constant(y[rows])))
        print(f"step {step} loss {float(loss):.6f}", flush=True)
elif args.python_next:
    for step, dist_inputs in enumerate(dist_data, 1):
        if step > args.steps:
            break
        began = time.perf_counter()  # the step's own work, as the script times it
        loss = float(distributed_train_step(dist_inputs))
        compute_ms = (time.perf_counter() - began) * 1000.0
        print(f"step {step} loss {loss:.6f} compute_ms {compute_ms:.3f}", flush=True)
else:
    iterator = iter(dist_data)
    for step in range(1, args.steps + 1):
        if step == args.raise_at:
            raise RuntimeError(f"the script's own error at step {step}")
        loss = train_step(iterator)
        print(f"step {step} loss {float(loss):.6f}", flush=True)
print(f"iterations {int(optimizer.iterations.numpy())}", flush=True)
print("trained", file=sys.stderr, flush=True)
