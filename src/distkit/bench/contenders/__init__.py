"""The contender scripts of ``distkit bench``'s peers measurement: each is run as a file
by its own launcher (torchrun, ``accelerate launch``, ``python``), never imported; this
file only makes them part of the installed package."""
