// The orders in which the node area's collectives reduce the members' inputs: the same orders
// as the message algorithms (Group::allreduce, reduce_scatter, reduce), so that a result does not
// depend on which way a call went. Each reads every input in place from the area.
#pragma once

#include <cstddef>
#include <vector>

#include "ferry/ferry.hpp"

namespace ferry::coll {

// out = the reduction of the n inputs in recursive doubling's order (Group::allreduce): the first
// 2 (n - pow2) inputs fold in pairs, lower first, then the pow2 partial results combine at
// distance 1, 2, 4..., lower first; the inputs start `offset` bytes in. `scratch` holds pow2
// buffers of count elements.
void reduce_in_doubling_order(std::byte* out, const std::vector<const std::byte*>& x,
                              std::size_t offset, std::size_t count, DataType type, ReduceOp op,
                              std::byte* scratch);

// out = a block of the n inputs (starting `offset` bytes in, `count` elements) in the ring's
// order: the block passes from member `first` to first + 1, first + 2..., each adding its own
// data on the right, so the result is x_f op x_f+1 op ... op x_f-1, from the left (Group::
// allreduce's reduce-scatter starts block b at member b, reduce_scatter's and reduce's at b + 1).
// out may be one of the inputs' own block (the reduction goes element by element).
void reduce_in_ring_order(std::byte* out, const std::vector<const std::byte*>& x, int first,
                          std::size_t offset, std::size_t count, DataType type, ReduceOp op);

// The binomial tree's order (Group::reduce below FERRY_COLL_SMALL), over ranks relative to
// `root`: member v folds into its own input the partial results of its children v + 1, v + 2,
// v + 4... below `limit` (nearest first; each child the same over its own subtree). Returns where
// v's partial result is: its input for a leaf, else `out` at depth 0 and scratch buffer
// depth - 1 (of count elements each) below, which a parent reads before the next child reuses it.
const std::byte* reduce_in_tree_order(std::byte* out, const std::vector<const std::byte*>& x,
                                      int root, int v, int limit, std::size_t count, DataType type,
                                      ReduceOp op, std::byte* scratch, int depth);

}  // namespace ferry::coll
