#!/usr/bin/env python3
"""Writes the small valid seed inputs of tests/fuzz/corpus/ (committed; rerun after a format change).

Each seed follows the input layout that its target's LLVMFuzzerTestOneInput documents; frames and
headers mirror src/bootstrap/store_protocol.hpp, src/proto/wire.hpp and src/transport/shm/address.cpp
(host byte order: little-endian here).
"""
import os
import struct

HERE = os.path.dirname(os.path.abspath(__file__))


def u32(v): return struct.pack('<I', v)
def i32(v): return struct.pack('<i', v)
def u64(v): return struct.pack('<Q', v)
def blob(b): return u32(len(b)) + b


# ---- store frames: u32 length + u8 op + payload ----
HELLO, PUT, GET, BARRIER, ALLGATHER, ABORT = 1, 2, 3, 4, 5, 6
HELLO_OK, VALUE, BARRIER_DONE, ALLGATHER_DONE, ERROR = 16, 17, 18, 19, 20


def frame(op, payload=b''): return u32(1 + len(payload)) + bytes([op]) + payload
def hello(rank, size, pid): return frame(HELLO, i32(rank) + i32(size) + i32(pid))
def put(key, value): return frame(PUT, blob(key) + blob(value))
def get(key): return frame(GET, blob(key))
def allgather(b): return frame(ALLGATHER, blob(b))
def abort(code, reason): return frame(ABORT, i32(code) + blob(reason))
def value(key, v): return frame(VALUE, blob(key) + blob(v))
def allgather_done(blobs): return frame(ALLGATHER_DONE, u32(len(blobs)) + b''.join(map(blob, blobs)))
def error(code, message): return frame(ERROR, i32(code) + blob(message))


def store_frames():
    # u8 job size (for ALLGATHER_DONE), u8 how (bits 0-6: chunk size - 1; bit 7: keep lengths
    # over 64 KiB instead of folding them), then the byte stream.
    return {
        'requests': bytes([2, 127]) + hello(0, 2, 1234) + put(b'key', b'value') + get(b'key') +
        frame(BARRIER) + allgather(b'addr0') + abort(3, b'rank 0 failed'),
        'replies': bytes([2, 6]) + frame(HELLO_OK) + value(b'key', b'value') + frame(BARRIER_DONE) +
        allgather_done([b'addr0', b'addr1']) + error(7, b'malformed frame'),
        'partial': bytes([1, 0]) + put(b'k', b'v' * 20)[:17],
        'bad_length': bytes([1, 127]) + hello(1, 2, 1) + u32(0) + bytes([HELLO]),
        'large_frame': bytes([1, 0xff]) + u32(1 << 20) + bytes([ALLGATHER]) + u32((1 << 20) - 5),
    }


def store_server():
    # u8 job size - 1, then commands: u8 (client | action << 2) and the action's fields.
    def raw(client, data): return bytes([client | 0 << 2, len(data)]) + data
    def hello_cmd(client, rank): return bytes([client | 2 << 2, rank + 1, 0])
    def put_cmd(client, key, v): return bytes([client | 3 << 2, len(key)]) + key + bytes([len(v)]) + v
    def get_cmd(client, key): return bytes([client | 4 << 2, len(key)]) + key
    def barrier_cmd(client): return bytes([client | 5 << 2, 1])
    def allgather_cmd(client, b): return bytes([client | 5 << 2, 0, len(b)]) + b
    def abort_cmd(client, code, reason): return bytes([client | 6 << 2, code, len(reason)]) + reason
    def close_cmd(client): return bytes([client | 7 << 2])
    return {
        'job': bytes([1]) + hello_cmd(0, 0) + hello_cmd(1, 1) + put_cmd(0, b'k', b'v0') +
        get_cmd(1, b'k') + get_cmd(1, b'late') + put_cmd(0, b'late', b'x') + barrier_cmd(0) +
        barrier_cmd(1) + allgather_cmd(0, b'a0') + allgather_cmd(1, b'a1') + abort_cmd(1, 9, b'bye'),
        'raw_frames': bytes([0]) + raw(0, hello(0, 1, 42)) + raw(0, put(b'a', b'b')[:7]) +
        raw(0, put(b'a', b'b')[7:]) + raw(0, get(b'a')),
        'departed': bytes([2]) + hello_cmd(0, 0) + hello_cmd(1, 1) + barrier_cmd(0) + close_cmd(1) +
        hello_cmd(2, 2) + barrier_cmd(2) + close_cmd(1) + hello_cmd(1, 1),
        'refused': bytes([1]) + get_cmd(0, b'k') + hello_cmd(1, 5) + raw(2, u32(1 << 30)),
    }


# ---- protocol engine: active messages ----
AM_EAGER, AM_RTS, AM_CTS, AM_FRAG, AM_FIN = 1, 2, 3, 4, 5
AM_PUT, AM_GET, AM_ATOMIC, AM_RMA_ACK = 15, 16, 17, 18
AM_RMA_ACKS = 23


def am(am_id, body, fix=0): return bytes([am_id, fix]) + struct.pack('<H', len(body)) + body


def engine_am():
    # u8 setup (bits 0-1 receives, bit 2 rendezvous send, bit 3 eager send), per receive u8 how
    # (bits 0-2 capacity, bit 3 any source, bits 4-5 both set: bad source, bit 6 partial mask) and
    # u8 tag, u8 tag of the rendezvous send, u8 tag + u8 size of the eager send; then messages: u8 id
    # (0xff: progress), u8 fix (bit 0: aim at our request (fix >> 1) % count; bit 7: CTS rreq), u16
    # length, body.
    eager = u64(5) + b'payload!'
    rts = u64(5) + u64(100) + u64(0) + u64(0)
    return {
        'eager_matched': bytes([1, 7, 5]) + am(AM_EAGER, eager) + am(AM_EAGER, u64(6) + b'x'),
        'rts_matched': bytes([2, 3, 5, 0x0f, 9]) + am(AM_RTS, rts) + am(AM_RTS, u64(9) + u64(1 << 40) + u64(0) + u64(0)),
        'cts_to_send': bytes([0x04, 1]) + am(AM_CTS, u64(0) + u64(0) + u64(1000), fix=1) + bytes([0xff]),
        'fin_to_send': bytes([0x05, 6, 1, 1]) + am(AM_FIN, u64(0) + u32(0) + u32(0), fix=3),
        'frag': bytes([0x09, 7, 2, 2, 16]) + am(AM_FRAG, u64(0) + u64(0) + b'chunk', fix=1),
        # One-sided: the window's id and secret filled in (fix bit 6), in and out of range.
        'put_get_atomic': bytes([0]) + am(AM_PUT, u64(0) + u64(0) + u64(0) + u64(8) + b'12345678', fix=0x40)
            + am(AM_GET, u64(0) + u64(0) + u64(0) + u64(4000) + u64(96), fix=0x40)
            + am(AM_ATOMIC, u64(0) + u64(0) + u64(0) + u64(16) + bytes([0, 8]) + bytes(6) + u64(1) + u64(0), fix=0x40)
            + am(AM_PUT, u64(0) + u64(0) + u64(0) + u64(4090) + b'12345678', fix=0x40) + bytes([0xff]),
        'rma_ack_to_recv': bytes([1, 7, 5]) + am(AM_RMA_ACK, u64(0) + u64(8) + u32(0) + u32(0), fix=1),
        # Two answers in one message, the first aimed at the posted receive (fix bit 0).
        'rma_acks_to_recv': bytes([1, 7, 5]) + am(AM_RMA_ACKS, u32(2) + u32(0) + (u64(0) + u64(8) + u32(0) + u32(0)) * 2, fix=1),
        'unknown_and_short': bytes([0]) + am(0, b'') + am(9, b'abc') + am(AM_RTS, b'short') + am(AM_FIN, b''),
    }


# ---- shm address: string name, i32 pid, u32 fifo_size, bounce_count, bounce_size, u64 x2 ----
def shm_address():
    def address(name, pid): return (blob(name) + i32(pid) + u32(1024) + u32(64) + u32(32768) +
                                    u64(0x7f0000001000) + u64(0x1234567890abcdef))
    return {
        'valid': address(b'/ferry-job-0', 4242),
        'long_name': address(b'/' + b'n' * 254, 1),
        'bad_name': address(b'ferry/x', 1),
    }


def config_value():
    texts = ['1', 'yes', 'off', '32k', '4m', '1g', '2000', '-1', '0.5', '300', 'self,shm', 'warn',
             'first-send', 'unix:/tmp/store.sock', '', '16mib']
    return {f'value{i:02d}': t.encode() for i, t in enumerate(texts)}


# ---- address blob (src/proto/address_blob.cpp): u32 count + (blob name, blob address)* ----
def address_blob():
    def published(*pairs):
        return u32(len(pairs)) + b''.join(blob(n) + blob(a) for n, a in pairs)
    shm = shm_address()['valid']
    return {
        'self_only': published((b'self', b'')),
        'self_and_shm': published((b'self', b''), (b'shm', shm)),
        'empty': published(),
        'sixteen': published(*[(b't%d' % i, b'x' * i) for i in range(16)]),
        'too_many': published(*[(b't', b'')] * 17),
        'short_address': u32(1) + blob(b'shm') + u32(100) + b'abc',
    }


# ---- ofi (src/transport/ofi/wire.hpp): a 16-byte message header + body; an address header ----
def ofi_wire():
    def message(rank, length, body_length, magic=0xfe71, seq=0):
        return (bytes([3, 0]) + struct.pack('<H', magic) + i32(rank) + u32(length) + u32(seq) +
                b'b' * body_length)
    def address(node, name, magic=0x0f1ad0e5):
        return u32(magic) + i32(4242) + node.ljust(64, b'\0')[:64] + name
    node = b'0f4b8c1e-6f51-4bde-9d0c-3a1c2f1e9b77/4026531836'
    return {
        'message': message(2, 8, 8),
        'message_long_claim': message(2, 100, 8),
        'message_self': message(1, 0, 0),
        'message_bad_magic': message(2, 4, 4, magic=0x1111),
        'address': address(node, b'\x02\x00\x1f\x90\x7f\x00\x00\x01' + b'\0' * 8),
        'address_unterminated': u32(0x0f1ad0e5) + i32(1) + b'x' * 64 + b'name',
        'address_no_name': address(node, b''),
    }


# ---- PMI-1 (src/bootstrap/pmi.hpp): reply lines from a launcher, hex values ----
def pmi_wire():
    return {
        'init': b'cmd=response_to_init pmi_version=1 pmi_subversion=1 rc=0\n',
        'maxes': b'cmd=maxes kvsname_max=256 keylen_max=64 vallen_max=1024\n',
        'get_inline': b'cmd=get_result rc=0 msg=success value=h0a1bff\n',
        'get_header': b'cmd=get_result rc=0 msg=success value=c3.1500\n',
        'get_missing': b'cmd=get_result rc=-1 msg=key_not_found\n',
        'bad_hex': b'cmd=get_result rc=0 value=hzz0\n',
        'two_lines': b'cmd=barrier_out\ncmd=put_result rc=0 msg=success\n',
        'no_cmd': b'rc=0 cmd=x\n',
    }


def main():
    corpora = {'pmi_wire': pmi_wire(), 'ofi_wire': ofi_wire(), 'store_frames': store_frames(), 'store_server': store_server(),
               'engine_am': engine_am(), 'shm_address': shm_address(), 'config_value': config_value(),
               'address_blob': address_blob()}
    for name, seeds in corpora.items():
        # Writes the generated seeds over their files and leaves the others: reproducers of past
        # findings (engine_am/rts_read_over_self) are committed beside them and must stay.
        directory = os.path.join(HERE, 'corpus', name)
        os.makedirs(directory, exist_ok=True)
        for seed, data in seeds.items():
            with open(os.path.join(directory, seed), 'wb') as f:
                f.write(data)


if __name__ == '__main__':
    main()
