//! The Merkle tree of RFC 9162 (Certificate Transparency 2.0, section 2.1) with SHA-256: leaf
//! hashes `SHA-256(0x00 ‖ data)`, interior nodes `SHA-256(0x01 ‖ left ‖ right)`, the tree of n
//! leaves split at the largest power of two below n. A `Frontier` (the roots of the perfect
//! subtrees that make up the tree, largest first) extends a tree leaf by leaf in O(log n) memory,
//! which is how the database extends its tree from one checkpoint to the next; a `Tree` keeps
//! every level for paths.

use sha2::{Digest, Sha256};

pub type Hash = [u8; 32];

/// The hash of a leaf's data.
pub fn leaf_hash(data: &[u8]) -> Hash {
    let mut h = Sha256::new();
    h.update([0u8]);
    h.update(data);
    h.finalize().into()
}

/// The hash of an interior node.
pub fn node_hash(left: &Hash, right: &Hash) -> Hash {
    let mut h = Sha256::new();
    h.update([1u8]);
    h.update(left);
    h.update(right);
    h.finalize().into()
}

/// The root of an empty tree: SHA-256 of nothing.
pub fn empty_root() -> Hash {
    Sha256::digest([]).into()
}

/// The roots of the perfect subtrees of a tree of `size` leaves, one per bit set in `size`,
/// largest (leftmost) first.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Frontier {
    size: u64,
    nodes: Vec<Hash>,
}

impl Frontier {
    pub fn new() -> Frontier {
        Frontier::default()
    }

    /// A frontier as stored: `nodes` must hold one hash per bit set in `size`.
    pub fn from_parts(size: u64, nodes: Vec<Hash>) -> Option<Frontier> {
        (size.count_ones() as usize == nodes.len()).then_some(Frontier { size, nodes })
    }

    pub fn size(&self) -> u64 {
        self.size
    }

    pub fn nodes(&self) -> &[Hash] {
        &self.nodes
    }

    /// Appends a leaf hash.
    pub fn push(&mut self, leaf: Hash) {
        let mut node = leaf;
        let mut size = self.size;
        while size & 1 == 1 {
            let left = self.nodes.pop().expect("one node per bit set");
            node = node_hash(&left, &node);
            size >>= 1;
        }
        self.nodes.push(node);
        self.size += 1;
    }

    /// The root of the tree so far.
    pub fn root(&self) -> Hash {
        let mut nodes = self.nodes.iter().rev();
        let Some(last) = nodes.next() else {
            return empty_root();
        };
        nodes.fold(*last, |acc, left| node_hash(left, &acc))
    }
}

/// The root of the tree over `leaves` (leaf hashes).
pub fn root(leaves: &[Hash]) -> Hash {
    let mut f = Frontier::new();
    for leaf in leaves {
        f.push(*leaf);
    }
    f.root()
}

/// Every level of a tree, leaves first. A node without a right sibling moves up unchanged, which
/// gives the same tree as RFC 9162's split at the largest power of two.
#[derive(Clone, Debug)]
pub struct Tree {
    levels: Vec<Vec<Hash>>,
}

impl Tree {
    pub fn new(leaves: Vec<Hash>) -> Tree {
        let mut levels = vec![leaves];
        while levels.last().map_or(0, Vec::len) > 1 {
            let below = levels.last().unwrap();
            let above = below
                .chunks(2)
                .map(|pair| if pair.len() == 2 { node_hash(&pair[0], &pair[1]) } else { pair[0] })
                .collect();
            levels.push(above);
        }
        Tree { levels }
    }

    pub fn size(&self) -> u64 {
        self.levels[0].len() as u64
    }

    pub fn root(&self) -> Hash {
        match self.levels.last().and_then(|l| l.first()) {
            Some(h) if self.size() > 0 => *h,
            _ => empty_root(),
        }
    }

    /// The audit path of leaf `index` (RFC 9162 section 2.1.3.1), from the leaf up.
    pub fn path(&self, index: u64) -> Option<Vec<Hash>> {
        if index >= self.size() {
            return None;
        }
        let mut i = index as usize;
        let mut path = Vec::new();
        for level in &self.levels[..self.levels.len() - 1] {
            let sibling = i ^ 1;
            if sibling < level.len() {
                path.push(level[sibling]);
            }
            i >>= 1;
        }
        Some(path)
    }
}

/// Verifies an audit path (RFC 9162 section 2.1.3.2): is `leaf` the leaf at `index` of the tree
/// of `size` leaves whose root is `root`?
pub fn verify_inclusion(leaf: &Hash, index: u64, size: u64, path: &[Hash], root: &Hash) -> bool {
    if index >= size {
        return false;
    }
    let (mut f, mut s) = (index, size - 1);
    let mut r = *leaf;
    for p in path {
        if s == 0 {
            return false;
        }
        if f & 1 == 1 || f == s {
            r = node_hash(p, &r);
            if f & 1 == 0 {
                while f & 1 == 0 && f != 0 {
                    f >>= 1;
                    s >>= 1;
                }
            }
        } else {
            r = node_hash(&r, p);
        }
        f >>= 1;
        s >>= 1;
    }
    s == 0 && r == *root
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The leaves and roots of RFC 6962's reference implementation (certificate-transparency's
    /// merkle tree tests), which RFC 9162 keeps.
    const LEAVES: [&str; 8] =
        ["", "00", "10", "2021", "3031", "40414243", "5051525354555657", "606162636465666768696a6b6c6d6e6f"];
    const ROOTS: [&str; 8] = [
        "6e340b9cffb37a989ca544e6bb780a2c78901d3fb33738768511a30617afa01d",
        "fac54203e7cc696cf0dfcb42c92a1d9dbaf70ad9e621f4bd8d98662f00e3c125",
        "aeb6bcfe274b70a14fb067a5e5578264db0fa9b51af5e0ba159158f329e06e77",
        "d37ee418976dd95753c1c73862b9398fa2a2cf9b4ff0fdfe8b30cd95209614b7",
        "4e3bbb1f7b478dcfe71fb631631519a3bca12c9aefca1612bfce4c13a86264d4",
        "76e67dadbcdf1e10e1b74ddc608abd2f98dfb16fbce75277b5232a127f2087ef",
        "ddb89be403809e325750d3d263cd78929c2942b7942a34b77e122c9594a74c8c",
        "5dc9da79a70659a9ad559cb701ded9a2ab9d823aad2f4960cfe370eff4604328",
    ];

    fn reference_leaves() -> Vec<Hash> {
        LEAVES.iter().map(|l| leaf_hash(&hex::decode(l).unwrap())).collect()
    }

    /// RFC 6962's recursive definition, for comparison.
    fn mth(leaves: &[Hash]) -> Hash {
        match leaves.len() {
            0 => empty_root(),
            1 => leaves[0],
            n => {
                let mut k = 1;
                while k * 2 < n {
                    k *= 2;
                }
                node_hash(&mth(&leaves[..k]), &mth(&leaves[k..]))
            }
        }
    }

    #[test]
    fn roots_match_the_reference_vectors() {
        let leaves = reference_leaves();
        assert_eq!(
            hex::encode(root(&[])),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
        for n in 1..=8 {
            assert_eq!(hex::encode(root(&leaves[..n])), ROOTS[n - 1], "{n} leaves (frontier)");
            assert_eq!(
                hex::encode(Tree::new(leaves[..n].to_vec()).root()),
                ROOTS[n - 1],
                "{n} leaves (tree)"
            );
            assert_eq!(hex::encode(mth(&leaves[..n])), ROOTS[n - 1], "{n} leaves (recursive)");
        }
    }

    #[test]
    fn every_path_verifies_and_no_other_leaf_or_index_does() {
        let leaves: Vec<Hash> = (0..70u32).map(|i| leaf_hash(&i.to_be_bytes())).collect();
        for n in 1..=leaves.len() {
            let tree = Tree::new(leaves[..n].to_vec());
            let r = tree.root();
            assert_eq!(r, mth(&leaves[..n]));
            for i in 0..n as u64 {
                let path = tree.path(i).unwrap();
                assert!(verify_inclusion(&leaves[i as usize], i, n as u64, &path, &r), "n={n} i={i}");
                let other = leaves[(i as usize + 1) % leaves.len()];
                assert!(!verify_inclusion(&other, i, n as u64, &path, &r));
                if n > 1 {
                    assert!(!verify_inclusion(&leaves[i as usize], (i + 1) % n as u64, n as u64, &path, &r));
                }
                // (The same path may also fit a tree one leaf larger: the size is bound by the
                // signed checkpoint, not by the path.)
                if !path.is_empty() {
                    assert!(!verify_inclusion(&leaves[i as usize], i, n as u64, &path[..path.len() - 1], &r));
                }
            }
            assert!(tree.path(n as u64).is_none());
        }
    }

    #[test]
    fn a_frontier_extends_a_tree_from_where_it_stopped() {
        let leaves: Vec<Hash> = (0..100u32).map(|i| leaf_hash(&i.to_le_bytes())).collect();
        let mut f = Frontier::new();
        for (n, leaf) in leaves.iter().enumerate() {
            let stored = Frontier::from_parts(f.size(), f.nodes().to_vec()).unwrap();
            assert_eq!(stored, f);
            f.push(*leaf);
            assert_eq!(f.root(), root(&leaves[..=n]));
        }
        assert!(Frontier::from_parts(3, vec![[0; 32]]).is_none());
    }
}
