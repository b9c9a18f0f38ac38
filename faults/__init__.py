"""The seeded fault runner: real turns, real workers, a provider that misbehaves on purpose.

`python -m faults --runs N --seed S` (or `make faults RUNS=N SEED=S`). See runner.py.
"""
