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

namespace {

// Decodes and checks record `i` at `p`; canonical on success (host bits of the subnet and unused
// address bytes cleared). False with `error` naming the record and the rule.
bool DecodeRecord(const uint8_t* p, size_t i, PeerRecord* out, std::string* error) {
  PeerRecord r;
  r.family = p[0];
  r.prefix = p[1];
  r.flags = p[2];
  r.public_family = p[3];
  r.port = LoadBe16(p + 4);
  std::memcpy(r.vtep_mac, p + 6, 6);
  std::memcpy(r.subnet, p + 16, 16);
  std::memcpy(r.public_ip, p + 32, 16);
  const char* rule = nullptr;
  if (r.family != 4 && r.family != 6) {
    rule = "subnet family must be 4 or 6";
  } else if (r.prefix > (r.family == 4 ? 32 : 128)) {
    rule = "prefix length out of range";
  } else if (r.public_family != 4 && r.public_family != 6) {
    rule = "public address family must be 4 or 6";
  } else if ((r.flags & ~kPeerFlagVtepMac) != 0) {
    rule = "unknown flags";
  }
  if (rule != nullptr) {
    *error = "peer record " + std::to_string(i) + ": " + rule;
    return false;
  }
  // Canonicalise: host bits of the subnet and unused address bytes cleared.
  size_t alen = r.family == 4 ? 4 : 16;
  for (size_t b = 0; b < 16; b++) {
    int bits = static_cast<int>(r.prefix) - static_cast<int>(b * 8);
    uint8_t mask = b >= alen || bits <= 0 ? 0
                   : bits >= 8            ? 0xff
                                          : static_cast<uint8_t>(0xff << (8 - bits));
    r.subnet[b] &= mask;
  }
  if (r.public_family == 4) std::memset(r.public_ip + 4, 0, 12);
  *out = r;
  return true;
}

bool DecodeRecords(const uint8_t* buf, size_t len, std::vector<PeerRecord>* out,
                   std::string* error) {
  if (len % kPeerRecordSize != 0) {
    *error = "peer table length " + std::to_string(len) + " is not a multiple of " +
             std::to_string(kPeerRecordSize);
    return false;
  }
  size_t n = len / kPeerRecordSize;
  out->resize(n);
  for (size_t i = 0; i < n; i++) {
    if (!DecodeRecord(buf + i * kPeerRecordSize, i, &(*out)[i], error)) return false;
  }
  return true;
}

}  // namespace

std::unique_ptr<PeerTable> PeerTable::Build(const uint8_t* buf, size_t len, std::string* error) {
  std::unique_ptr<PeerTable> t(new PeerTable());
  if (!DecodeRecords(buf, len, &t->records_, error)) return nullptr;
  // One hash level per distinct prefix length, longest first.
  for (uint8_t family : {static_cast<uint8_t>(4), static_cast<uint8_t>(6)}) {
    std::vector<uint8_t> prefixes;
    for (const PeerRecord& r : t->records_) {
      if (r.family == family) prefixes.push_back(r.prefix);
    }
    std::sort(prefixes.begin(), prefixes.end(), std::greater<uint8_t>());
    std::vector<Level>& levels = t->LevelsOf(family);
    for (size_t i = 0; i < prefixes.size();) {
      size_t j = i;
      while (j < prefixes.size() && prefixes[j] == prefixes[i]) j++;
      Level level;
      level.prefix = prefixes[i];
      level.count = static_cast<uint32_t>(j - i);
      size_t cap = Capacity(j - i);
      level.index.slots.assign(cap, 0);
      level.index.mask = cap - 1;
      levels.push_back(std::move(level));
      i = j;
    }
  }
  for (uint32_t ri = 0; ri < t->records_.size(); ri++) {
    const PeerRecord& r = t->records_[ri];
    Level* level = t->FindLevel(r.family, r.prefix);
    Key k = t->RecordKey(r, false);
    if (t->Probe(level->index, k, false) != nullptr) {
      *error = "peer record " + std::to_string(ri) + ": subnet repeats an earlier record";
      return nullptr;
    }
    Insert(&level->index, Hash(k), ri);
  }
  // Every record is in the public index (records may share a public address: a dual-stack
  // peer over one underlay), so a removal takes exactly its own entry out.
  size_t cap = Capacity(t->records_.size());
  t->public_index_.slots.assign(cap, 0);
  t->public_index_.mask = cap - 1;
  for (uint32_t ri = 0; ri < t->records_.size(); ri++) {
    Insert(&t->public_index_, Hash(t->RecordKey(t->records_[ri], true)), ri);
  }
  return t;
}

bool PeerDelta::Parse(const uint8_t* removed, size_t removed_len, const uint8_t* upserts,
                      size_t upserts_len, PeerDelta* out, std::string* error) {
  std::string e;
  if (!DecodeRecords(removed, removed_len, &out->removed, &e)) {
    *error = "removed: " + e;
    return false;
  }
  if (!DecodeRecords(upserts, upserts_len, &out->upserts, &e)) {
    *error = "upserts: " + e;
    return false;
  }
  // A subnet twice in one list: a table of those alone would be refused.
  for (auto [list, name] :
       {std::make_pair(&out->removed, "removed"), std::make_pair(&out->upserts, "upserts")}) {
    std::unique_ptr<PeerTable> t(new PeerTable());
    for (uint32_t i = 0; i < list->size(); i++) {
      if (t->Find((*list)[i]) >= 0) {
        *error = std::string(name) + ": peer record " + std::to_string(i) +
                 ": subnet repeats an earlier record";
        return false;
      }
      t->Upsert((*list)[i]);
    }
  }
  return true;
}

PeerTable::Level* PeerTable::FindLevel(uint8_t family, uint8_t prefix) {
  for (Level& l : LevelsOf(family)) {
    if (l.prefix == prefix) return &l;
  }
  return nullptr;
}

int64_t PeerTable::Find(const PeerRecord& r) const {
  const std::vector<Level>& levels = r.family == 4 ? levels_v4_ : levels_v6_;
  for (const Level& l : levels) {
    if (l.prefix != r.prefix) continue;
    const PeerRecord* p = Probe(l.index, RecordKey(r, false), false);
    return p == nullptr ? -1 : p - records_.data();
  }
  return -1;
}

bool PeerTable::Check(const PeerDelta& d, std::string* error) const {
  for (size_t i = 0; i < d.removed.size(); i++) {
    if (Find(d.removed[i]) < 0) {
      *error = "removed: peer record " + std::to_string(i) + ": subnet not in the table";
      return false;
    }
  }
  return true;
}

uint64_t PeerTable::SlotOf(const Index& idx, uint32_t record_index, bool by_public) const {
  uint64_t i = Hash(RecordKey(records_[record_index], by_public)) & idx.mask;
  while (idx.slots[i] != record_index + 1) i = (i + 1) & idx.mask;
  return i;
}

void PeerTable::Erase(Index* idx, uint64_t slot, bool by_public) {
  uint64_t hole = slot;
  for (uint64_t j = (hole + 1) & idx->mask; idx->slots[j] != 0; j = (j + 1) & idx->mask) {
    uint64_t home = Hash(RecordKey(records_[idx->slots[j] - 1], by_public)) & idx->mask;
    // The entry at j may move to the hole unless its home lies cyclically in (hole, j].
    bool stays = hole <= j ? (home > hole && home <= j) : (home > hole || home <= j);
    if (stays) continue;
    idx->slots[hole] = idx->slots[j];
    hole = j;
  }
  idx->slots[hole] = 0;
}

void PeerTable::Add(Index* idx, uint32_t count_after, uint32_t record_index, bool by_public) {
  if (idx->slots.empty() || static_cast<size_t>(count_after) * 2 > idx->slots.size()) {
    std::vector<uint32_t> old = std::move(idx->slots);
    size_t cap = Capacity(count_after);
    idx->slots.assign(cap, 0);
    idx->mask = cap - 1;
    for (uint32_t s : old) {
      if (s != 0) Insert(idx, Hash(RecordKey(records_[s - 1], by_public)), s - 1);
    }
  }
  Insert(idx, Hash(RecordKey(records_[record_index], by_public)), record_index);
}

void PeerTable::Remove(const PeerRecord& r) {
  uint32_t i = static_cast<uint32_t>(Find(r));
  uint32_t last = static_cast<uint32_t>(records_.size() - 1);
  std::vector<Level>& levels = LevelsOf(records_[i].family);
  auto level = std::find_if(levels.begin(), levels.end(),
                            [&](const Level& l) { return l.prefix == records_[i].prefix; });
  if (--level->count == 0) {
    levels.erase(level);
  } else {
    Erase(&level->index, SlotOf(level->index, i, false), false);
  }
  Erase(&public_index_, SlotOf(public_index_, i, true), true);
  if (i != last) {
    // The last record takes the hole: its index entries point at its new place.
    const PeerRecord& moved = records_[last];
    Level* ml = FindLevel(moved.family, moved.prefix);
    ml->index.slots[SlotOf(ml->index, last, false)] = i + 1;
    public_index_.slots[SlotOf(public_index_, last, true)] = i + 1;
    records_[i] = moved;
    if (aux_stride_ != 0) {
      std::memcpy(&aux_[static_cast<size_t>(i) * aux_stride_],
                  &aux_[static_cast<size_t>(last) * aux_stride_], aux_stride_);
    }
  }
  records_.pop_back();
  if (aux_stride_ != 0) aux_.resize(records_.size() * aux_stride_);
}

uint32_t PeerTable::Upsert(const PeerRecord& r) {
  int64_t found = Find(r);
  if (found >= 0) {
    uint32_t i = static_cast<uint32_t>(found);
    bool same_public = records_[i].public_family == r.public_family &&
                       std::memcmp(records_[i].public_ip, r.public_ip, 16) == 0;
    if (!same_public) Erase(&public_index_, SlotOf(public_index_, i, true), true);
    records_[i] = r;
    if (!same_public) Insert(&public_index_, Hash(RecordKey(r, true)), i);
    return i;
  }
  uint32_t i = static_cast<uint32_t>(records_.size());
  records_.push_back(r);
  if (aux_stride_ != 0) aux_.resize(records_.size() * aux_stride_);
  std::vector<Level>& levels = LevelsOf(r.family);
  Level* level = FindLevel(r.family, r.prefix);
  if (level == nullptr) {
    // A new prefix length: its level goes in longest-first order.
    auto at = std::find_if(levels.begin(), levels.end(),
                           [&](const Level& l) { return l.prefix < r.prefix; });
    Level fresh;
    fresh.prefix = r.prefix;
    level = &*levels.insert(at, std::move(fresh));
  }
  level->count++;
  Add(&level->index, level->count, i, false);
  Add(&public_index_, static_cast<uint32_t>(records_.size()), i, true);
  return i;
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
