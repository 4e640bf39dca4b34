"""A person's own Keras script, as the guides write it: model.fit under MirroredStrategy.

It knows nothing of gpuwatch (the tests run it with and without `gpuwatch run`). Two
logical CPU devices stand in for two GPUs. Seeded and deterministic; it can write the
loss of every batch as the script itself computes it, and its final weights.
"""

import argparse
import json
import time

import numpy as np

parser = argparse.ArgumentParser()
parser.add_argument("--spe", type=int, default=1, help="steps_per_execution")
parser.add_argument("--epochs", type=int, default=2)
parser.add_argument("--initial-epoch", type=int, default=0, help="fit's initial_epoch")
parser.add_argument("--examples", type=int, default=512)
parser.add_argument("--batch", type=int, default=64, help="global batch")
parser.add_argument("--lr", type=float, default=0.05)
parser.add_argument("--lr-decay", type=float, default=None,
                    help="an ExponentialDecay schedule: lr * decay ** step")
parser.add_argument("--dataset", action="store_true", help="a tf.data pipeline, not arrays")
parser.add_argument("--read-ms", type=float, default=0.0, help="host cost of each batch's read")
parser.add_argument("--losses-out", default=None, help="write each batch's loss (JSON)")
parser.add_argument("--deterministic", action="store_true", help="op determinism on")
parser.add_argument("--width", type=int, default=64, help="hidden units")
parser.add_argument("--depth", type=int, default=1, help="hidden layers")
parser.add_argument("--features", type=int, default=32, help="input features")
parser.add_argument("--time-epochs", type=int, default=0,
                    help="then time this many more epochs and print examples_per_s=")
parser.add_argument("--weights-out", default=None, help="write the final weights (.npz)")
parser.add_argument("--raise-at-batch", type=int, default=0,
                    help="a callback of the script's raises at this batch of the first epoch")
args = parser.parse_args()

import tensorflow as tf  # noqa: E402

cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
import keras  # noqa: E402

keras.utils.set_random_seed(0)
if args.deterministic:
    tf.config.experimental.enable_op_determinism()
strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])

rng = np.random.default_rng(0)
x = rng.normal(size=(args.examples, args.features)).astype("float32")
y = rng.integers(0, 10, size=(args.examples,)).astype("int64")

with strategy.scope():
    model = keras.Sequential([
        keras.Input((args.features,)),
        *[keras.layers.Dense(args.width, activation="relu") for _ in range(args.depth)],
        keras.layers.Dense(10),
    ])
    model.compile(
        optimizer=keras.optimizers.SGD(
            args.lr if args.lr_decay is None else keras.optimizers.schedules.ExponentialDecay(
                args.lr, decay_steps=1, decay_rate=args.lr_decay)),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        steps_per_execution=args.spe,
    )

initial = model.get_weights()
callbacks = []
if args.raise_at_batch:
    class Breaks(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            if batch + 1 == args.raise_at_batch:
                raise RuntimeError(f"the script's own error at batch {batch + 1}")

    callbacks.append(Breaks())
if args.dataset:
    def slow_read(i):
        time.sleep(args.read_ms / 1000.0)
        return i

    data = tf.data.Dataset.from_tensor_slices((x, y)).batch(args.batch)
    if args.read_ms:
        data = data.map(lambda a, b: (tf.py_function(slow_read, [a], tf.float32), b))
        data = data.map(lambda a, b: (tf.ensure_shape(a, [None, args.features]), b))
    model.fit(data, epochs=args.epochs, verbose=0, callbacks=callbacks)
else:
    model.fit(x, y, batch_size=args.batch, epochs=args.epochs, shuffle=False, verbose=0,
              callbacks=callbacks, initial_epoch=args.initial_epoch)

if args.time_epochs:
    class EpochClock(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.seconds = []

        def on_epoch_begin(self, epoch, logs=None):
            self.began = time.perf_counter()

        def on_epoch_end(self, epoch, logs=None):
            self.seconds.append(time.perf_counter() - self.began)

    clock = EpochClock()
    began = time.perf_counter()
    if args.dataset:
        model.fit(data, epochs=args.time_epochs, verbose=0, callbacks=[clock])
    else:
        model.fit(x, y, batch_size=args.batch, epochs=args.time_epochs, shuffle=False,
                  verbose=0, callbacks=[clock])
    rate = args.time_epochs * args.examples / (time.perf_counter() - began)
    median = sorted(clock.seconds)[len(clock.seconds) // 2]
    print(f"examples_per_s={rate:.1f} median_epoch_examples_per_s="
          f"{args.examples / median:.1f}", flush=True)

if args.losses_out:
    # With lr 0 the weights never move: each batch's loss is the loss of these weights.
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    losses = []
    for _ in range(args.epochs):
        for i in range(0, args.examples, args.batch):
            xb, yb = x[i:i + args.batch], y[i:i + args.batch]
            losses.append(float(loss_fn(yb, model(xb, training=False))))
    with open(args.losses_out, "w") as fh:
        json.dump(losses, fh)
if args.weights_out:
    np.savez(args.weights_out, *model.get_weights())
print("trained", flush=True)
