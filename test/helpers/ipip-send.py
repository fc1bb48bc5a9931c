"""Sends IPIP packets (IP protocol 4) through a raw socket, for the userspace ipip tests (Node has
no raw sockets). One JSON argument:

  mode "spoof":  exactly `count` ICMP echo requests innerSrc -> innerDst inside outer IPv4
                 outerSrc -> target (a lease holder's address with a foreign inner source)
  mode "mixed":  exactly `count` bad packets outerSrc -> target, cycling through: no inner
                 packet at all, 1 byte, a cut inner IPv4 header, an inner IPv6 packet, an inner
                 packet whose total length runs past the end, random bytes
  mode "random": random inner bytes (0..1400 long) outerSrc -> target for `seconds`

Prints {"sent": n}. The kernel fills the outer total length and checksum (IP_HDRINCL).
"""
import json
import os
import random
import socket
import struct
import sys
import time


def checksum(b):
    if len(b) % 2:
        b += b"\0"
    s = sum(struct.unpack("!%dH" % (len(b) // 2), b))
    while s > 0xFFFF:
        s = (s & 0xFFFF) + (s >> 16)
    return ~s & 0xFFFF


def ipv4(src, dst, proto, payload, ttl=64):
    h = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 20 + len(payload), 0, 0, ttl, proto, 0,
                    socket.inet_aton(src), socket.inet_aton(dst))
    return h[:10] + struct.pack("!H", checksum(h)) + h[12:] + payload


def echo(seq):
    body = struct.pack("!BBHHH", 8, 0, 0, 0x7777, seq) + b"weft-ipip-test"
    return body[:2] + struct.pack("!H", checksum(body)) + body[4:]


def main():
    a = json.loads(sys.argv[1])
    s = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_RAW)
    outer = lambda inner: ipv4(a["outerSrc"], a["target"], 4, inner)
    sent = 0

    def send(pkt):
        nonlocal sent
        s.sendto(pkt, (a["target"], 0))
        sent += 1

    if a["mode"] == "spoof":
        for i in range(a["count"]):
            send(outer(ipv4(a["innerSrc"], a["innerDst"], 1, echo(i))))
            time.sleep(0.001)
    elif a["mode"] == "mixed":
        rng = random.Random(7)
        v6 = bytes([0x60, 0, 0, 0, 0, 8, 17, 64]) + bytes(32) + bytes(8)
        for i in range(a["count"]):
            k = i % 6
            if k == 0:
                inner = b""
            elif k == 1:
                inner = b"\x45"
            elif k == 2:
                inner = ipv4("10.5.9.9", "10.5.8.8", 1, echo(i))[:12]
            elif k == 3:
                inner = v6
            elif k == 4:
                p = bytearray(ipv4("10.5.9.9", "10.5.8.8", 1, echo(i)))
                p[2:4] = struct.pack("!H", len(p) + 100)
                inner = bytes(p)
            else:
                inner = bytes(rng.getrandbits(8) for _ in range(rng.randrange(1, 200)))
            send(outer(inner))
            time.sleep(0.001)
    else:
        end = time.time() + a["seconds"]
        while time.time() < end:
            send(outer(os.urandom(random.randrange(0, 1400))))
    print(json.dumps({"sent": sent}))


main()
