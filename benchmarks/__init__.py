"""Throughput benchmarks: the Trainer side by side with hand-written loops and Keras fit."""
