# cython: language_level=3, boundscheck=False, wraparound=False
"""Receipt handles (a pop's POP_CK: 'ckOffset popTime invisibleTime reviveQid retry brokerName
queueId offset') grouped by their checkpoint: what a batch ack sends, one BatchAck per checkpoint
with the offsets acked.  Plain values in and out; the Python layer (SimpleConsumer._batch_acks)
parses each checkpoint's fields once and names a bad handle."""

from libc.limits cimport LLONG_MAX


def group_by_checkpoint(list handles, list topics):
    """{(topic, the handle's first 7 fields): [index of its first handle, [offsets (int)]]} of
    handles[i] (a str) with topics[i], in the order first seen.  ValueError(i) for the first
    handle whose last field is not a non-negative Java long (or that has none); TypeError for one
    that is not a str.  The handles of one checkpoint usually come one after another: a handle
    that starts with the previous one's head is not sliced or looked up again."""
    cdef dict groups = {}
    cdef Py_ssize_t i, j, n, cut, count = len(handles), head_len = -1
    cdef str h, head = None
    cdef object topic, head_topic = None
    cdef list offsets = None
    cdef long long offset
    cdef Py_UCS4 ch
    if len(topics) != count:
        raise ValueError(f"{count} handles but {len(topics)} topics")
    for i in range(count):
        h = handles[i]
        topic = topics[i]
        n = len(h)
        cut = h.rfind(" ")
        if cut < 0 or n - cut - 1 < 1 or n - cut - 1 > 19:
            raise ValueError(i)
        offset = 0
        for j in range(cut + 1, n):
            ch = h[j]
            if ch < 48 or ch > 57 or offset > (LLONG_MAX - (<long long>ch - 48)) // 10:  # ('0'..'9', a long)
                raise ValueError(i)
            offset = offset * 10 + (<long long>ch - 48)
        if cut != head_len or not (topic is head_topic or topic == head_topic) or not h.startswith(head):
            head = h[:cut]
            head_len, head_topic = cut, topic
            key = (topic, head)
            entry = groups.get(key)
            if entry is None:
                offsets = []
                groups[key] = [i, offsets]
            else:
                offsets = entry[1]
        offsets.append(offset)
    return groups
