"""Choosing a recipe: the settings a run, a lock or a search gives a model's INT8/FP8 recipe, and the layers its
fallback keeps wider, each in its format. Between judging (which it uses to score candidates) and running (which
consumes the finished recipes)."""
