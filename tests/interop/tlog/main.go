// Command tlogcheck reads a directory of C2SP tlog-tiles with Go's own transparency-log
// package (golang.org/x/mod/sumdb/tlog and .../note), as a client that never saw
// Evidence Ledger's code would: it opens the checkpoint with the given verifier key,
// re-derives the tree's root from the tiles (TileHashReader authenticates every tile it
// reads against that root), proves and checks the inclusion of the entries named, each
// read from its entry bundle and hashed as RFC 6962 says, and proves and checks the
// consistency of the tree with each older tree given as SIZE:HEXROOT.
//
// Usage: tlogcheck DIR VERIFIER_KEY INDEXES OLDTREES
// (INDEXES and OLDTREES comma-separated, either may be empty). It prints one JSON
// object and exits 0 when every check held.
package main

import (
	"encoding/base64"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/mod/sumdb/note"
	"golang.org/x/mod/sumdb/tlog"
)

const largeEntry = "evidence-ledger/large-entry/v1\n"

// files reads C2SP tiles: tile/<L>/<N>[.p/<W>] (Go's paths carry the height too).
type files struct{ dir string }

func (f files) Height() int { return 8 }

func (f files) ReadTiles(tiles []tlog.Tile) ([][]byte, error) {
	out := make([][]byte, len(tiles))
	for i, t := range tiles {
		goPath := t.Path() // tile/8/L/NNN[.p/W]
		c2sp := "tile/" + strings.TrimPrefix(goPath, "tile/8/")
		data, err := os.ReadFile(filepath.Join(f.dir, c2sp))
		if err != nil {
			return nil, err
		}
		out[i] = data
	}
	return out, nil
}

func (f files) SaveTiles([]tlog.Tile, [][]byte) {}

func entryPath(n int64, w int) string {
	t := tlog.Tile{H: 8, L: 0, N: n, W: w}
	return "tile/entries/" + strings.TrimPrefix(t.Path(), "tile/8/0/")
}

func bundleEntry(dir string, size, index int64) ([]byte, error) {
	n := index / 256
	w := 256
	if (n+1)*256 > size {
		w = int(size - n*256)
	}
	data, err := os.ReadFile(filepath.Join(dir, entryPath(n, w)))
	if err != nil {
		return nil, err
	}
	for i := int64(0); ; i++ {
		if len(data) < 2 {
			return nil, fmt.Errorf("bundle %d ends before entry %d", n, index)
		}
		length := int(binary.BigEndian.Uint16(data))
		if len(data) < 2+length {
			return nil, fmt.Errorf("bundle %d: entry %d is cut short", n, i)
		}
		if n*256+i == index {
			return data[2 : 2+length], nil
		}
		data = data[2+length:]
	}
}

func fail(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "tlogcheck: "+format+"\n", args...)
	os.Exit(1)
}

func main() {
	if len(os.Args) != 5 {
		fail("usage: tlogcheck DIR VERIFIER_KEY INDEXES OLDTREES")
	}
	dir := os.Args[1]
	raw, err := os.ReadFile(filepath.Join(dir, "checkpoint"))
	if err != nil {
		fail("%v", err)
	}
	verifier, err := note.NewVerifier(os.Args[2])
	if err != nil {
		fail("verifier key: %v", err)
	}
	opened, err := note.Open(raw, note.VerifierList(verifier))
	if err != nil {
		fail("checkpoint: %v", err)
	}
	lines := strings.Split(opened.Text, "\n")
	size, err := strconv.ParseInt(lines[1], 10, 64)
	if err != nil {
		fail("checkpoint size: %v", err)
	}
	rootBytes, err := base64.StdEncoding.DecodeString(lines[2])
	if err != nil || len(rootBytes) != tlog.HashSize {
		fail("checkpoint root: %v", err)
	}
	var root tlog.Hash
	copy(root[:], rootBytes)
	reader := tlog.TileHashReader(tlog.Tree{N: size, Hash: root}, files{dir})
	derived, err := tlog.TreeHash(size, reader)
	if err != nil || derived != root {
		fail("the tiles do not hash to the checkpoint's root: %v", err)
	}
	result := map[string]any{"origin": lines[0], "size": size, "records": 0, "trees": 0}
	large := map[string]string{}
	for _, field := range strings.Split(os.Args[3], ",") {
		if field == "" {
			continue
		}
		index, _ := strconv.ParseInt(field, 10, 64)
		entry, err := bundleEntry(dir, size, index)
		if err != nil {
			fail("%v", err)
		}
		proof, err := tlog.ProveRecord(size, index, reader)
		if err != nil {
			fail("prove %d: %v", index, err)
		}
		if strings.HasPrefix(string(entry), largeEntry) {
			// A commitment to an event too large for a bundle: its level-0 hash is
			// proven here; the caller checks it against the event's bytes.
			hashes, err := reader.ReadHashes([]int64{tlog.StoredHashIndex(0, index)})
			if err != nil {
				fail("leaf %d: %v", index, err)
			}
			if err := tlog.CheckRecord(proof, size, root, index, hashes[0]); err != nil {
				fail("record %d: %v", index, err)
			}
			large[field] = hex.EncodeToString(hashes[0][:])
			continue
		}
		if err := tlog.CheckRecord(proof, size, root, index, tlog.RecordHash(entry)); err != nil {
			fail("record %d: %v", index, err)
		}
		result["records"] = result["records"].(int) + 1
	}
	for _, field := range strings.Split(os.Args[4], ",") {
		if field == "" {
			continue
		}
		parts := strings.SplitN(field, ":", 2)
		old, _ := strconv.ParseInt(parts[0], 10, 64)
		want, err := hex.DecodeString(parts[1])
		if err != nil {
			fail("old root: %v", err)
		}
		oldHash, err := tlog.TreeHash(old, reader)
		if err != nil || hex.EncodeToString(oldHash[:]) != hex.EncodeToString(want) {
			fail("tree %d: the tiles give another root: %v", old, err)
		}
		proof, err := tlog.ProveTree(size, old, reader)
		if err != nil {
			fail("prove tree %d: %v", old, err)
		}
		if err := tlog.CheckTree(proof, size, root, old, oldHash); err != nil {
			fail("tree %d: %v", old, err)
		}
		result["trees"] = result["trees"].(int) + 1
	}
	result["large"] = large
	out, _ := json.Marshal(result)
	fmt.Println(string(out))
}
