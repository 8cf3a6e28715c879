// The node area's reduction orders (see node_orders.hpp).
#include "coll/node_orders.hpp"

#include "coll/reduce.hpp"

namespace ferry::coll {

// out = the reduction of the n inputs in recursive doubling's order (Group::allreduce): the first
// 2 (n - pow2) inputs fold in pairs, lower first, then the pow2 partial results combine at
// distance 1, 2, 4..., lower first; the inputs start `offset` bytes in. `scratch` holds pow2
// buffers of count elements.
void reduce_in_doubling_order(std::byte* out, const std::vector<const std::byte*>& x,
                              std::size_t offset, std::size_t count, DataType type, ReduceOp op,
                              std::byte* scratch) {
  const int n = static_cast<int>(x.size());
  const std::size_t bytes = count * size_of(type);
  int pow2 = 1;
  while (pow2 * 2 <= n) pow2 *= 2;
  const int extra = n - pow2;
  auto tmp = [&](int k) { return scratch + static_cast<std::size_t>(k) * bytes; };
  const std::byte* v[64];  // pow2 <= 64: members of one node (checked by NodeCollectives::prepare)
  for (int k = 0; k < pow2; ++k) {
    const auto at = static_cast<std::size_t>(k);
    if (k < extra) {
      reduce_to(tmp(k), x[2 * at] + offset, x[2 * at + 1] + offset, count, type, op);
      v[k] = tmp(k);
    } else {
      v[k] = x[at + static_cast<std::size_t>(extra)] + offset;
    }
  }
  for (int step = 1; step < pow2; step *= 2) {
    for (int k = 0; k + step < pow2; k += 2 * step) {
      std::byte* to = 2 * step == pow2 ? out : tmp(k);  // the last step writes the result
      reduce_to(to, v[k], v[k + step], count, type, op);
      v[k] = to;
    }
  }
}

// out = a block of the n inputs (starting `offset` bytes in, `count` elements) in the ring's
// order: the block passes from member `first` to first + 1, first + 2..., each adding its own
// data on the right, so the result is x_f op x_f+1 op ... op x_f-1, from the left (Group::
// allreduce's reduce-scatter starts block b at member b, reduce_scatter's and reduce's at b + 1).
// out may be one of the inputs' own block (the reduction goes element by element).
void reduce_in_ring_order(std::byte* out, const std::vector<const std::byte*>& x, int first,
                          std::size_t offset, std::size_t count, DataType type, ReduceOp op) {
  const int n = static_cast<int>(x.size());
  const std::byte* left = x[static_cast<std::size_t>(first)] + offset;
  for (int t = 1; t < n; ++t) {
    const std::byte* right = x[static_cast<std::size_t>((first + t) % n)] + offset;
    reduce_to(out, left, right, count, type, op);
    left = out;
  }
}

// The binomial tree's order (Group::reduce below FERRY_COLL_SMALL), over ranks relative to
// `root`: member v folds into its own input the partial results of its children v + 1, v + 2,
// v + 4... below `limit` (nearest first; each child the same over its own subtree). Returns where
// v's partial result is: its input for a leaf, else `out` at depth 0 and scratch buffer
// depth - 1 (of count elements each) below, which a parent reads before the next child reuses it.
const std::byte* reduce_in_tree_order(std::byte* out, const std::vector<const std::byte*>& x,
                                      int root, int v, int limit, std::size_t count, DataType type,
                                      ReduceOp op, std::byte* scratch, int depth) {
  const int n = static_cast<int>(x.size());
  auto input = [&](int relative) { return x[static_cast<std::size_t>((relative + root) % n)]; };
  if (limit == 1 || v + 1 >= n) return input(v);
  std::byte* acc =
      depth == 0 ? out : scratch + static_cast<std::size_t>(depth - 1) * count * size_of(type);
  reduce_to(acc, input(v), input(v + 1), count, type, op);  // child v + 1 is a leaf
  for (int mask = 2; mask < limit && v + mask < n; mask <<= 1) {
    const std::byte* part =
        reduce_in_tree_order(nullptr, x, root, v + mask, mask, count, type, op, scratch, depth + 1);
    reduce_to(acc, acc, part, count, type, op);
  }
  return acc;
}

}  // namespace ferry::coll
