"""The gradient check, written once for every framework: probes, verdicts, location, the report.

A framework gives it an evaluator (``evaluator.Evaluator``); numpy only.
"""
