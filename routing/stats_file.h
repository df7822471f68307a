// Stats files: RoutingStats (routing/routing_stats.h) on disk, written by the
// daemon and read by the daemon on restart and by moe-place.
//
// Versioned binary ("MOEDSTAT", version 1 or 2), little endian, with a checksum;
// written atomically (temp file, fsync, rename) so moe-place never reads half
// a file. Errors are Input errors naming the file.
//
//   "MOEDSTAT"  u32 version  u32 layers  u32 experts  u32 max_k  f64 half_life
//   u64 steps  u64 sample_count
//   f64 x values   (normalized: what the accessors return; layout of raw())
//   u32 x sample_count x layers x (max_k + 1)   (sample cells, oldest first)
//   (version 2 only) u32 layers x experts, f64 x that: the router biases
//   u64 FNV-1a 64 of every byte before it
//
// Version 2 is written only when the statistics hold router biases (online
// bias balancing, docs/router-policies.md); both versions are read.
//
// A file read back has weight 1, the written steps and half-life, and a sample
// capacity of exactly the paths it holds.
#pragma once

#include <string>

#include "routing/routing_stats.h"

namespace moed::routing {

void write_stats_file(const RoutingStats& stats, const std::string& path);
RoutingStats read_stats_file(const std::string& path);

}  // namespace moed::routing
