// The peer table: longest-prefix match from an inner address to the peer (lease) that holds it.
// Built from ONE buffer of fixed-size records (the layout below is mirrored by
// src/dataplane/peer-table.ts), or changed in place by a PeerDelta (records removed, added or
// replaced by subnet) at a cost proportional to the delta. A published table is never changed:
// the engine applies a delta to a table no packet thread can see (the one it replaced, once its
// readers are gone, or a copy) and swaps it in atomically (engine.h), so packet threads read
// without locks.
#ifndef WEFT_NATIVE_PEER_TABLE_H_
#define WEFT_NATIVE_PEER_TABLE_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace weft {

// One record, 64 bytes, all multi-byte fields in network byte order:
//   0  u8      subnet family (4 | 6)
//   1  u8      subnet prefix length
//   2  u8      flags (bit 0: vtep_mac is set, i.e. the peer speaks VXLAN)
//   3  u8      public address family (4 | 6)
//   4  u16     peer UDP port
//   6  u8[6]   peer VtepMAC
//   12 u8[4]   reserved, zero
//   16 u8[16]  subnet address (IPv4 in the first 4 bytes, the rest zero)
//   32 u8[16]  peer public address (IPv4 in the first 4 bytes, the rest zero)
//   48 u8[16]  reserved, zero
constexpr size_t kPeerRecordSize = 64;
constexpr uint8_t kPeerFlagVtepMac = 1;

struct PeerRecord {
  uint8_t family = 0;
  uint8_t prefix = 0;
  uint8_t flags = 0;
  uint8_t public_family = 0;
  uint16_t port = 0;  // host order
  uint8_t vtep_mac[6] = {};
  uint8_t subnet[16] = {};
  uint8_t public_ip[16] = {};

  size_t public_len() const { return public_family == 4 ? 4 : 16; }
  bool has_vtep_mac() const { return (flags & kPeerFlagVtepMac) != 0; }
};

// A change to a table: the subnets of `removed` leave it, then each of `upserts` is added or
// replaces the record of its subnet. Parsed and checked (PeerDelta::Parse, PeerTable::Check)
// before any table is touched.
struct PeerDelta {
  std::vector<PeerRecord> removed;  // only family, prefix and subnet are used
  std::vector<PeerRecord> upserts;

  // Decodes two buffers of records (peer_table.h format; each may be empty). Returns false
  // with `error` naming the record when a field is out of range or a subnet repeats within
  // one of them.
  static bool Parse(const uint8_t* removed, size_t removed_len, const uint8_t* upserts,
                    size_t upserts_len, PeerDelta* out, std::string* error);
};

class PeerTable {
 public:
  PeerTable() = default;
  PeerTable(const PeerTable&) = default;  // a writable copy of a published table
  PeerTable& operator=(const PeerTable&) = delete;

  // Decodes `len` bytes of records. Returns null and sets `error` (naming the record) when the
  // length is not a multiple of the record size, a field is out of range or a subnet repeats.
  static std::unique_ptr<PeerTable> Build(const uint8_t* buf, size_t len, std::string* error);

  // The record whose subnet holds `addr` with the longest prefix; null when none does.
  // `addr_len` is 4 or 16.
  const PeerRecord* Lookup(size_t addr_len, const uint8_t* addr) const;

  // True when some record's public address equals `addr`.
  bool HasPublic(size_t addr_len, const uint8_t* addr) const;

  // Whether `d` applies to this table: every removed subnet is in it. False with `error`.
  bool Check(const PeerDelta& d, std::string* error) const;

  // Applies `d` (checked against this table's contents) in place: removed records leave (the
  // last record takes a removed one's place), new records are appended, replaced ones keep
  // their place. With aux attached, `fill_aux(record, aux)` fills the aux bytes of every record
  // written. Never call on a table a packet thread may be reading.
  template <typename FillAux>
  void Apply(const PeerDelta& d, FillAux fill_aux) {
    for (const PeerRecord& r : d.removed) Remove(r);
    for (const PeerRecord& r : d.upserts) {
      uint32_t i = Upsert(r);
      if (aux_stride_ != 0) fill_aux(records_[i], &aux_[static_cast<size_t>(i) * aux_stride_]);
    }
  }
  void Apply(const PeerDelta& d) {
    Apply(d, [](const PeerRecord&, uint8_t*) {});
  }

  size_t size() const { return records_.size(); }
  const PeerRecord* records() const { return records_.data(); }

  // Bytes a sender derives per record (the engine's egress-TAP header templates), attached
  // before the table is published: `stride` bytes per record, in record order (an empty table
  // takes an empty vector and the stride, so Apply keeps them for the records it adds). Aux(r)
  // is null when none are attached.
  void SetAux(std::vector<uint8_t> aux, size_t stride) {
    aux_ = std::move(aux);
    aux_stride_ = stride;
  }
  size_t aux_stride() const { return aux_stride_; }
  const uint8_t* Aux(const PeerRecord* r) const {
    if (aux_.empty()) return nullptr;
    return &aux_[static_cast<size_t>(r - records_.data()) * aux_stride_];
  }

 private:
  friend struct PeerDelta;
  struct Key {
    uint64_t hi = 0;
    uint64_t lo = 0;
    uint8_t family = 0;
    bool operator==(const Key& o) const { return hi == o.hi && lo == o.lo && family == o.family; }
  };
  // An open-addressing hash of record indices (+1; 0 = empty) keyed by masked address.
  struct Index {
    std::vector<uint32_t> slots;
    uint64_t mask = 0;
  };
  struct Level {
    uint8_t prefix = 0;
    uint32_t count = 0;
    Index index;
  };

  static Key MakeKey(uint8_t family, const uint8_t* addr, uint8_t prefix);
  static uint64_t Hash(const Key& k);
  const PeerRecord* Probe(const Index& idx, const Key& k, bool by_public) const;
  Key RecordKey(const PeerRecord& r, bool by_public) const;
  static void Insert(Index* idx, uint64_t hash, uint32_t record_index);
  // The slot holding `record_index` on its probe chain in `idx`.
  uint64_t SlotOf(const Index& idx, uint32_t record_index, bool by_public) const;
  // Empties `slot`, moving later entries of the probe run back (linear probing's deletion).
  void Erase(Index* idx, uint64_t slot, bool by_public);
  // Adds `record_index` to `idx`, doubling its capacity first when it would be over half full.
  void Add(Index* idx, uint32_t count_after, uint32_t record_index, bool by_public);
  std::vector<Level>& LevelsOf(uint8_t family) { return family == 4 ? levels_v4_ : levels_v6_; }
  Level* FindLevel(uint8_t family, uint8_t prefix);
  // The index of the record of `r`'s subnet, or -1.
  int64_t Find(const PeerRecord& r) const;
  void Remove(const PeerRecord& r);
  uint32_t Upsert(const PeerRecord& r);

  std::vector<PeerRecord> records_;
  std::vector<Level> levels_v4_;  // longest prefix first
  std::vector<Level> levels_v6_;
  Index public_index_;
  std::vector<uint8_t> aux_;
  size_t aux_stride_ = 0;
};

}  // namespace weft

#endif  // WEFT_NATIVE_PEER_TABLE_H_
