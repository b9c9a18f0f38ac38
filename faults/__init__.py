"""The seeded fault runner: real turns, real workers, a provider that misbehaves on purpose.

`python -m faults --runs N --seed S` (or `make faults RUNS=N SEED=S`). See runner.py. On a fleet (three pools
on one Redis over TCP) whose workers, pools and Redis are killed meanwhile: `python -m faults.chaos` (or
`make chaos`). See chaos.py.
"""
