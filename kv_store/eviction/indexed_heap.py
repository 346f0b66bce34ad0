"""A binary heap that knows where each item is, so a key can change in O(log n) without a scan
(heapq has no decrease-key). Min-heap on the key; negate for max."""

from __future__ import annotations

from typing import Any


class IndexedHeap:
    def __init__(self):
        self._items: list[Any] = []
        self._keys: list[Any] = []
        self._pos: dict[Any, int] = {}

    def __len__(self) -> int:
        return len(self._items)

    def __contains__(self, item) -> bool:
        return item in self._pos

    def peek(self):
        return self._items[0] if self._items else None

    def key(self, item):
        return self._keys[self._pos[item]]

    def push(self, item, key) -> None:
        """Insert, or change the key of an item already in the heap."""
        if item in self._pos:
            i = self._pos[item]
            old, self._keys[i] = self._keys[i], key
            self._up(i) if key < old else self._down(i)
            return
        self._items.append(item)
        self._keys.append(key)
        self._pos[item] = len(self._items) - 1
        self._up(len(self._items) - 1)

    def remove(self, item) -> None:
        i = self._pos.pop(item, None)
        if i is None:
            return
        last_item, last_key = self._items.pop(), self._keys.pop()
        if i == len(self._items):
            return
        self._items[i], self._keys[i] = last_item, last_key
        self._pos[last_item] = i
        self._up(i)
        self._down(self._pos[last_item])

    def _swap(self, i: int, j: int) -> None:
        self._items[i], self._items[j] = self._items[j], self._items[i]
        self._keys[i], self._keys[j] = self._keys[j], self._keys[i]
        self._pos[self._items[i]], self._pos[self._items[j]] = i, j

    def _up(self, i: int) -> None:
        while i and self._keys[i] < self._keys[(i - 1) // 2]:
            self._swap(i, (i - 1) // 2)
            i = (i - 1) // 2

    def _down(self, i: int) -> None:
        n = len(self._items)
        while True:
            smallest, left = i, 2 * i + 1
            for child in (left, left + 1):
                if child < n and self._keys[child] < self._keys[smallest]:
                    smallest = child
            if smallest == i:
                return
            self._swap(i, smallest)
            i = smallest


class HeapPolicy:
    """An eviction policy whose order is a key per page (smallest evicted first): subclasses give
    `_key(page)`; inserts, touches and removals are O(log n)."""

    def __init__(self):
        self._heap = IndexedHeap()
        self._info: dict = {}

    def _key(self, page):
        raise NotImplementedError

    def insert(self, page, info) -> None:
        self._info[page] = info
        self._heap.push(page, self._key(page))

    def touch(self, page) -> None:
        if page in self._heap:
            self._heap.push(page, self._key(page))

    def remove(self, page, evicted: bool = False) -> None:
        self._heap.remove(page)
        self._info.pop(page, None)

    def victim(self):
        return self._heap.peek()

    def admit(self, candidate, victim) -> bool:
        return True

    def __len__(self) -> int:
        return len(self._heap)
