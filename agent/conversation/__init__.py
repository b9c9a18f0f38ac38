"""The conversation wing: everything about a conversation's state, from its contract to its export.

- the store, the only owner of every Redis key: store.py (the one door, `Store`), reads.py,
  writes.py, index.py, flags.py, room.py; keys.py lists every key; scripts/*.lua enforce the
  contract's rules atomically; errors.py is what the store refuses (`StoreRefused` and its kinds);
- what a stored state means: well_formed.py (read as the contract says, or refused), turns.py
  (one splitter into typed `TurnView`s, for the page, the export and the CLI);
- how a turn ends: endings.py (one `Ending` value, one constructor per way) and words.py (the words a
  person reads for each status and kind);
- what is built from it: listing.py (the list of conversations), export.py (a file of one).

The contract itself (agent/contract.py) sits below the wing: providers, tools and traces share it.
Nothing is imported here, so the pure parts (keys, errors, words) load without Redis.
"""
