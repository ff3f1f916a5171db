"""Findings from stored gradient matrices: the rules, and the findings they become; numpy only."""
