#include "peer_table.h"

#include <algorithm>
#include <cstring>

#include "checksum.h"

namespace weft {

namespace {

uint64_t LoadBe64(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; i++) v = (v << 8) | p[i];
  return v;
}

uint64_t Mask64(int bits) {  // the top `bits` bits of a 64-bit word, 0..64
  if (bits <= 0) return 0;
  if (bits >= 64) return ~0ull;
  return ~0ull << (64 - bits);
}

size_t Capacity(size_t n) {
  size_t cap = 8;
  while (cap < n * 2) cap <<= 1;
  return cap;
}

}  // namespace

PeerTable::Key PeerTable::MakeKey(uint8_t family, const uint8_t* addr, uint8_t prefix) {
  Key k;
  k.family = family;
  if (family == 4) {
    uint64_t a = static_cast<uint64_t>(LoadBe32(addr)) << 32;
    k.hi = a & Mask64(prefix);
  } else {
    k.hi = LoadBe64(addr) & Mask64(prefix);
    k.lo = LoadBe64(addr + 8) & Mask64(static_cast<int>(prefix) - 64);
  }
  return k;
}

uint64_t PeerTable::Hash(const Key& k) {
  uint64_t h = k.hi * 0x9e3779b97f4a7c15ull;
  h ^= (k.lo + k.family) * 0xc2b2ae3d27d4eb4full;
  h ^= h >> 29;
  h *= 0xbf58476d1ce4e5b9ull;
  h ^= h >> 32;
  return h;
}

void PeerTable::Insert(Index* idx, uint64_t hash, uint32_t record_index) {
  for (uint64_t i = hash & idx->mask;; i = (i + 1) & idx->mask) {
    if (idx->slots[i] == 0) {
      idx->slots[i] = record_index + 1;
      return;
    }
  }
}

PeerTable::Key PeerTable::RecordKey(const PeerRecord& r, bool by_public) const {
  if (by_public) {
    return MakeKey(r.public_family, r.public_ip, r.public_family == 4 ? 32 : 128);
  }
  return MakeKey(r.family, r.subnet, r.prefix);
}

const PeerRecord* PeerTable::Probe(const Index& idx, const Key& k, bool by_public) const {
  if (idx.slots.empty()) return nullptr;
  for (uint64_t i = Hash(k) & idx.mask;; i = (i + 1) & idx.mask) {
    uint32_t s = idx.slots[i];
    if (s == 0) return nullptr;
    const PeerRecord& r = records_[s - 1];
    if (RecordKey(r, by_public) == k) return &r;
  }
}

std::unique_ptr<PeerTable> PeerTable::Build(const uint8_t* buf, size_t len,
                                            std::string* error) {
  if (len % kPeerRecordSize != 0) {
    *error = "peer table length " + std::to_string(len) + " is not a multiple of " +
             std::to_string(kPeerRecordSize);
    return nullptr;
  }
  std::unique_ptr<PeerTable> t(new PeerTable());
  size_t n = len / kPeerRecordSize;
  t->records_.reserve(n);
  for (size_t i = 0; i < n; i++) {
    const uint8_t* p = buf + i * kPeerRecordSize;
    PeerRecord r;
    r.family = p[0];
    r.prefix = p[1];
    r.flags = p[2];
    r.public_family = p[3];
    r.port = LoadBe16(p + 4);
    std::memcpy(r.vtep_mac, p + 6, 6);
    std::memcpy(r.subnet, p + 16, 16);
    std::memcpy(r.public_ip, p + 32, 16);
    std::string where = "peer record " + std::to_string(i) + ": ";
    if (r.family != 4 && r.family != 6) {
      *error = where + "subnet family must be 4 or 6";
      return nullptr;
    }
    if (r.prefix > (r.family == 4 ? 32 : 128)) {
      *error = where + "prefix length out of range";
      return nullptr;
    }
    if (r.public_family != 4 && r.public_family != 6) {
      *error = where + "public address family must be 4 or 6";
      return nullptr;
    }
    if ((r.flags & ~kPeerFlagVtepMac) != 0) {
      *error = where + "unknown flags";
      return nullptr;
    }
    // Canonicalise: host bits of the subnet and unused address bytes cleared.
    Key k = MakeKey(r.family, r.subnet, r.prefix);
    std::memset(r.subnet, 0, 16);
    for (int b = 0; b < 8; b++) r.subnet[b] = static_cast<uint8_t>(k.hi >> (56 - 8 * b));
    for (int b = 0; b < 8; b++) r.subnet[8 + b] = static_cast<uint8_t>(k.lo >> (56 - 8 * b));
    if (r.public_family == 4) std::memset(r.public_ip + 4, 0, 12);
    t->records_.push_back(r);
  }
  // One hash level per distinct prefix length, longest first.
  for (uint8_t family : {static_cast<uint8_t>(4), static_cast<uint8_t>(6)}) {
    std::vector<uint8_t> prefixes;
    for (const PeerRecord& r : t->records_) {
      if (r.family == family) prefixes.push_back(r.prefix);
    }
    std::sort(prefixes.begin(), prefixes.end(), std::greater<uint8_t>());
    std::vector<Level>& levels = family == 4 ? t->levels_v4_ : t->levels_v6_;
    for (size_t i = 0; i < prefixes.size();) {
      size_t j = i;
      while (j < prefixes.size() && prefixes[j] == prefixes[i]) j++;
      Level level;
      level.prefix = prefixes[i];
      size_t cap = Capacity(j - i);
      level.index.slots.assign(cap, 0);
      level.index.mask = cap - 1;
      for (uint32_t ri = 0; ri < t->records_.size(); ri++) {
        const PeerRecord& r = t->records_[ri];
        if (r.family != family || r.prefix != level.prefix) continue;
        Key k = t->RecordKey(r, false);
        if (t->Probe(level.index, k, false) != nullptr) {
          *error = "peer record " + std::to_string(ri) + ": subnet repeats an earlier record";
          return nullptr;
        }
        Insert(&level.index, Hash(k), ri);
      }
      levels.push_back(std::move(level));
      i = j;
    }
  }
  size_t cap = Capacity(t->records_.size());
  t->public_index_.slots.assign(cap, 0);
  t->public_index_.mask = cap - 1;
  for (uint32_t ri = 0; ri < t->records_.size(); ri++) {
    Key k = t->RecordKey(t->records_[ri], true);
    if (t->Probe(t->public_index_, k, true) == nullptr) {
      Insert(&t->public_index_, Hash(k), ri);
    }
  }
  return t;
}

const PeerRecord* PeerTable::Lookup(size_t addr_len, const uint8_t* addr) const {
  uint8_t family = addr_len == 4 ? 4 : 6;
  const std::vector<Level>& levels = family == 4 ? levels_v4_ : levels_v6_;
  for (const Level& level : levels) {
    const PeerRecord* r = Probe(level.index, MakeKey(family, addr, level.prefix), false);
    if (r != nullptr) return r;
  }
  return nullptr;
}

bool PeerTable::HasPublic(size_t addr_len, const uint8_t* addr) const {
  uint8_t family = addr_len == 4 ? 4 : 6;
  return Probe(public_index_, MakeKey(family, addr, family == 4 ? 32 : 128), true) != nullptr;
}

}  // namespace weft
