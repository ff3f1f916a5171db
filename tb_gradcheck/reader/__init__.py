"""The reading side: TensorBoard's plugin, the queries behind the tab and the CLI, the store, compare.

Imports no framework: TensorBoard loads the plugin through its ``tensorboard_plugins`` entry point.
"""
