"""gpuwatch's bundled training runtime: the only package that imports TensorFlow.

Importing this package (or its protocol and schema modules) must stay cheap and
TensorFlow-free; TensorFlow is imported by the modules that train.
"""
