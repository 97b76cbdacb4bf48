"""Judging outputs: comparison metrics, tolerances, confidence intervals, the recipe-vs-runtime
verdicts, diagnosis of a failure, layer sensitivity, and planted defects that measure the judge.

Nothing here makes artifacts; modules that execute a graph do it through a backend's runner.
"""
