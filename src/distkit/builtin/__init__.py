"""The default problem: offline datasets (``data``), plain models (``models``) and the text
task's parts (``text``). Nothing here knows about processes or ranks."""
