#include "pagoda/kv/prefix_cache.h"

#include <algorithm>
#include <functional>
#include <queue>
#include <unordered_set>
#include <utility>

#include "pagoda/core/error.h"
#include "pagoda/core/fnv1a.h"

namespace pagoda::kv {
namespace {

// A block's children are few, so any spread-out hash of its token ids will do; collisions cost
// one extra token comparison, never a wrong match.
uint64_t hash_tokens(std::span<const int32_t> tokens) { return fnv1a(tokens.data(), tokens.size_bytes()); }

}  // namespace

PrefixCache::PrefixCache(BlockPool& pool) : pool_(pool) {}

PrefixCache::~PrefixCache() { clear(); }

PrefixCache::Node* PrefixCache::find_child(Node& parent, std::span<const int32_t> block_tokens,
                                           uint64_t hash) const {
  auto [first, last] = parent.children.equal_range(hash);
  for (auto it = first; it != last; ++it)
    if (std::ranges::equal(it->second->tokens, block_tokens)) return it->second.get();
  return nullptr;
}

std::vector<BlockId> PrefixCache::match(std::span<const int32_t> tokens) {
  const size_t bs = size_t(block_size());
  const uint64_t now = ++clock_;
  std::vector<BlockId> ids;
  Node* node = &root_;
  for (size_t start = 0; start + bs <= tokens.size(); start += bs) {
    const std::span<const int32_t> block = tokens.subspan(start, bs);
    node = find_child(*node, block, hash_tokens(block));
    if (node == nullptr) break;
    node->last_access = now;
    ids.push_back(node->block);
  }
  return ids;
}

std::vector<BlockId> PrefixCache::insert(std::span<const int32_t> tokens, std::span<const BlockId> block_ids) {
  const size_t bs = size_t(block_size());
  const size_t num_full = tokens.size() / bs;
  if (block_ids.size() < num_full) {
    fail(ErrorKind::kInternal, "prefix cache insert: {} full blocks of tokens but {} block ids", num_full,
         block_ids.size());
  }
  const uint64_t now = ++clock_;
  std::vector<BlockId> cached;
  cached.reserve(num_full);
  Node* node = &root_;
  for (size_t i = 0; i < num_full; ++i) {
    const std::span<const int32_t> block = tokens.subspan(i * bs, bs);
    const uint64_t hash = hash_tokens(block);
    Node* child = find_child(*node, block, hash);
    if (child == nullptr) {
      pool_.retain(block_ids[i]);  // throws, changing nothing, for a free or unknown id
      auto owned = std::make_unique<Node>();
      owned->tokens.assign(block.begin(), block.end());
      owned->block = block_ids[i];
      owned->parent = node;
      child = owned.get();
      node->children.emplace(hash, std::move(owned));
      ++num_cached_;
    }
    child->last_access = now;
    cached.push_back(child->block);
    node = child;
  }
  return cached;
}

void PrefixCache::remove_leaf(Node& leaf) {
  Node& parent = *leaf.parent;
  pool_.release(leaf.block);
  --num_cached_;
  auto [first, last] = parent.children.equal_range(hash_tokens(leaf.tokens));
  for (auto it = first; it != last; ++it) {
    if (it->second.get() == &leaf) {
      parent.children.erase(it);  // destroys leaf
      return;
    }
  }
}

int32_t PrefixCache::evict(int32_t n) {
  if (n <= 0) return 0;
  // Candidates: leaves only the cache holds, oldest first (ties, which one path cannot make,
  // broken by block id so the order is deterministic).
  using Candidate = std::pair<uint64_t, BlockId>;
  std::priority_queue<std::pair<Candidate, Node*>, std::vector<std::pair<Candidate, Node*>>, std::greater<>> heap;
  auto consider = [&](Node& node) {
    if (&node != &root_ && node.children.empty() && pool_.refcount(node.block) == 1)
      heap.push({{node.last_access, node.block}, &node});
  };
  std::vector<Node*> stack{&root_};
  while (!stack.empty()) {
    Node* node = stack.back();
    stack.pop_back();
    consider(*node);
    for (auto& [hash, child] : node->children) stack.push_back(child.get());
  }

  int32_t freed = 0;
  while (freed < n && !heap.empty()) {
    Node* leaf = heap.top().second;
    heap.pop();
    Node* parent = leaf->parent;
    remove_leaf(*leaf);
    ++freed;
    consider(*parent);
  }
  return freed;
}

int32_t PrefixCache::num_evictable_blocks() const {
  // A block is pinned when someone besides the cache holds it or anything cached below it:
  // mark each held block and its ancestors; every unmarked block is evictable.
  std::unordered_set<const Node*> pinned;
  std::vector<const Node*> stack{&root_};
  while (!stack.empty()) {
    const Node* node = stack.back();
    stack.pop_back();
    for (const auto& [hash, child] : node->children) stack.push_back(child.get());
    if (node == &root_ || pool_.refcount(node->block) == 1) continue;
    for (const Node* up = node; up != &root_; up = up->parent)
      if (!pinned.insert(up).second) break;  // the rest of the way up is marked already
  }
  return num_cached_ - int32_t(pinned.size());
}

void PrefixCache::clear() {
  // Deepest nodes first, so that no destructor recurses down a long chain (a 128k-token
  // context is 8k blocks deep).
  std::vector<Node*> preorder;
  std::vector<Node*> stack{&root_};
  while (!stack.empty()) {
    Node* node = stack.back();
    stack.pop_back();
    preorder.push_back(node);
    for (auto& [hash, child] : node->children) stack.push_back(child.get());
  }
  for (auto it = preorder.rbegin(); it != preorder.rend(); ++it) {
    Node* node = *it;
    if (node != &root_) pool_.release(node->block);
    node->children.clear();
  }
  num_cached_ = 0;
}

}  // namespace pagoda::kv
