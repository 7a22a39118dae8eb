"""``distkit grade``: a class's submissions graded by the exercise checks, each learner's
code in a sandbox of its own, the verdict decided by the grader (docs/grading.md).

- :mod:`distkit.grade.sandbox`: one command in bubblewrap, with limits, its output bounded;
- :mod:`distkit.grade.plugin`: the pytest plugin that runs inside it and signs each verdict;
- :mod:`distkit.grade.runner`: learners x exercises, side by side, into results;
- :mod:`distkit.grade.reports`: the gradebook CSV, Gradescope's results.json, the HTML pages.
"""
