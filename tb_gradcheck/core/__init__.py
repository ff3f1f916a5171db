"""The core every writer and the reader share: the stored format, the statistics' definitions, argument checks.

No framework is imported here: numpy and TensorBoard's own event writer only.
"""
