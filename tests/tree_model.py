"""A plain model of one conversation's tree of turns, which the store, every read and every export must agree
with (tests/test_store_tree.py, tests/test_branch_property.py)."""

from __future__ import annotations


class Model:
    """A plain model of one conversation's tree: each turn's parent, its person's message and its answer."""

    def __init__(self):
        self.parent, self.message, self.answer, self.kids, self.tip = {}, {}, {}, {"": []}, ""

    def add(self, turn_id, parent, message, answer):
        self.parent[turn_id], self.message[turn_id], self.answer[turn_id] = parent, message, answer
        self.kids.setdefault(parent, []).append(turn_id)
        self.kids[turn_id] = []
        self.tip = turn_id

    def switch(self, turn_id):
        while self.kids[turn_id]:
            turn_id = self.kids[turn_id][-1]
        self.tip = turn_id
        return turn_id

    def path(self, tip=None):
        path, turn = [], self.tip if tip is None else tip
        while turn:
            path.insert(0, turn)
            turn = self.parent[turn]
        return path

    def texts(self, path):
        return [text for turn in path for text in (self.message[turn], self.answer[turn])]

    def leaves(self):
        order = []

        def walk(parent):
            for kid in self.kids[parent]:
                if not self.kids[kid]:
                    order.append(kid)
                walk(kid)

        walk("")
        return order

    def depth_first(self):
        order = []

        def walk(parent):
            for kid in self.kids[parent]:
                order.append(kid)
                walk(kid)

        walk("")
        return order
