"""A person's own training loops with GradientTape and apply_gradients, no strategy.run,
in the shapes the TensorFlow and Keras guides write them. It knows nothing of gpuwatch.
At its end it prints each optimizer's iterations ("iterations NAME=N").

--shape:
  eager     the guide's eager loop: for x, y in dataset: tape, apply_gradients
  function  the same step in a tf.function, the batch taken in Python and handed in
  whole     the whole loop inside one tf.function (autograph's while loop)
  lso       mixed precision: a LossScaleOptimizer in a tf.function step
  two       two optimizers each step (a GAN's generator and discriminator)
  phases    one optimizer, then a new one for a second phase (fine-tuning)
  mixed     Keras fit first, then the tf.function loop on the same optimizer
"""

import argparse
import time

import numpy as np

parser = argparse.ArgumentParser()
parser.add_argument("--shape", default="function",
                    choices=["eager", "function", "whole", "lso", "two", "phases", "mixed"])
parser.add_argument("--steps", type=int, default=12, help="updates of the loop")
parser.add_argument("--batch", type=int, default=32)
parser.add_argument("--restored", type=int, default=0,
                    help="the optimizer's iterations as a restored checkpoint left them")
parser.add_argument("--read-ms", type=float, default=0.0, help="host cost of each batch")
parser.add_argument("--no-read-ahead", action="store_true",
                    help="turn off tf.data's read-ahead (its injected prefetch and its autotuner, "
                         "which reads ahead without it): each batch is read when next() asks")
parser.add_argument("--eval-batch", type=int, default=0,
                    help="after each update, evaluate the model on a batch of this size "
                         "(training=False, and a plain call), as the tutorial's test step does")
parser.add_argument("--loss-scale", type=float, default=2.0 ** 15,
                    help="lso: the initial loss scale (a huge one overflows: skipped updates)")
args = parser.parse_args()

import keras  # noqa: E402
import tensorflow as tf  # noqa: E402

keras.utils.set_random_seed(0)
if args.shape == "lso":
    keras.mixed_precision.set_global_policy("mixed_float16")

rng = np.random.default_rng(0)
examples = args.batch * args.steps
x = rng.normal(size=(examples, 16)).astype("float32")
y = rng.integers(0, 4, size=(examples,)).astype("int64")


def read(i):
    time.sleep(args.read_ms / 1000.0)
    return i


data = tf.data.Dataset.from_tensor_slices((x, y)).batch(args.batch)
if args.read_ms:
    data = data.enumerate().map(
        lambda i, b: (tf.py_function(read, [i], tf.int64), b)).map(lambda i, b: b)
if args.no_read_ahead:
    options = tf.data.Options()
    options.experimental_optimization.inject_prefetch = False
    options.autotune.enabled = False
    data = data.with_options(options)


def make_model():
    return keras.Sequential([keras.Input((16,)), keras.layers.Dense(32, activation="relu"),
                             keras.layers.Dense(4)])


model = make_model()
loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
optimizer = keras.optimizers.SGD(0.01, name="sgd")
if args.shape == "lso":
    optimizer = keras.optimizers.LossScaleOptimizer(optimizer, initial_scale=args.loss_scale)
optimizer.build(model.trainable_variables)
if args.restored:
    optimizer.iterations.assign(args.restored)
critic = make_model()
critic_optimizer = keras.optimizers.Adam(0.001, name="critic_adam")
critic_optimizer.build(critic.trainable_variables)


def step(features, labels):
    with tf.GradientTape() as tape:
        logits = model(features, training=True)
        loss = loss_fn(labels, logits)
        if args.shape == "lso":
            loss = optimizer.scale_loss(loss)
    grads = tape.gradient(loss, model.trainable_variables)
    optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))
    if args.shape == "two":
        with tf.GradientTape() as tape:
            critic_loss = loss_fn(labels, critic(features, training=True))
        grads = tape.gradient(critic_loss, critic.trainable_variables)
        critic_optimizer.apply_gradients(zip(grads, critic.trainable_variables, strict=True))
    if args.eval_batch:
        held_out = tf.constant(x[: args.eval_batch])
        model(held_out, training=False)
        model(held_out)
    return loss


if args.shape == "eager":
    for features, labels in data:
        step(features, labels)
elif args.shape == "whole":
    @tf.function
    def train_all():
        for features, labels in data:
            step(features, labels)

    train_all()
elif args.shape == "phases":
    first = optimizer
    traced = tf.function(step)
    for features, labels in data.take(args.steps // 2):
        traced(features, labels)
    optimizer = keras.optimizers.SGD(0.001, name="sgd_finetune")  # a new phase
    optimizer.build(model.trainable_variables)
    traced = tf.function(step)
    for features, labels in data.skip(args.steps // 2):
        traced(features, labels)
else:
    if args.shape == "mixed":
        model.compile(optimizer=optimizer, loss=loss_fn)
        model.fit(x[: 4 * args.batch], y[: 4 * args.batch], batch_size=args.batch, epochs=1,
                  verbose=0)
    traced = tf.function(step)
    for features, labels in data:
        traced(features, labels)

optimizers = {"model": optimizer, "critic": critic_optimizer}
if args.shape == "phases":
    optimizers["first"] = first
for name, opt in optimizers.items():
    print(f"iterations {name}={int(opt.iterations.numpy())}", flush=True)
