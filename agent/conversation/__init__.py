"""The conversation wing: a conversation's state in Redis, behind one door (store.Store).

keys.py lists every Redis key the project writes; errors.py, what the store refuses (StoreRefused);
the Lua scripts that enforce the contract's rules are scripts/*.lua. Nothing is imported here, so
that the pure parts (keys, errors) can be imported without Redis.
"""
