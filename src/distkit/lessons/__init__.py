"""Props that only the notebooks use: collective demos, the scaling study, slow data,
XLA pitfalls, multi-node helpers and fault injection. The core never imports these."""
