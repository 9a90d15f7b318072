package main

import (
	"compress/gzip"
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"
)

func s(v string) *string { return &v }

// run writes ops as a history file and checks it.
func run(t *testing.T, ops []Op) Report {
	t.Helper()
	p := filepath.Join(t.TempDir(), "h.json")
	data, err := json.Marshal(History{Trial: t.Name(), Ops: ops})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, data, 0o644); err != nil {
		t.Fatal(err)
	}
	r := check(p, 10*time.Second, "")
	if r.Error != "" {
		t.Fatalf("check: %s", r.Error)
	}
	return r
}

func TestLinearizableHistoryPasses(t *testing.T) {
	r := run(t, []Op{
		{Client: 0, Kind: "set", Key: "k0", Value: "a", Call: 0, Ret: 10, Status: "ok"},
		// Concurrent with the SET: may see either.
		{Client: 1, Kind: "get", Key: "k0", Out: nil, Call: 5, Ret: 8, Status: "ok"},
		{Client: 1, Kind: "get", Key: "k0", Out: s("a"), Call: 11, Ret: 12, Status: "ok"},
		{Client: 0, Kind: "incr", Key: "n0", Out: s("1"), Call: 13, Ret: 14, Status: "ok"},
		{Client: 2, Kind: "get", Key: "k0", Out: s("a"), Call: 20, Ret: 21, Status: "ok", Final: true},
		{Client: 2, Kind: "get", Key: "n0", Out: s("1"), Call: 20, Ret: 21, Status: "ok", Final: true},
	})
	if r.Result != "Ok" || r.LostWrites != 0 {
		t.Fatalf("want Ok and no lost write: %+v", r)
	}
}

// A read that returns an older value after a newer write was acknowledged: the classic
// violation a deposed primary releasing output would cause.
func TestStaleReadIsIllegal(t *testing.T) {
	r := run(t, []Op{
		{Client: 0, Kind: "set", Key: "k0", Value: "a", Call: 0, Ret: 10, Status: "ok"},
		{Client: 0, Kind: "set", Key: "k0", Value: "b", Call: 11, Ret: 20, Status: "ok"},
		{Client: 1, Kind: "get", Key: "k0", Out: s("a"), Call: 21, Ret: 22, Status: "ok"},
		{Client: 1, Kind: "get", Key: "k1", Out: nil, Call: 23, Ret: 24, Status: "ok"},
	})
	if r.Result != "Illegal" || len(r.IllegalKeys) != 1 || r.IllegalKeys[0] != "k0" {
		t.Fatalf("want Illegal on k0: %+v", r)
	}
}

// An INCR whose reply the client never got may or may not have happened: later reads may see
// either count, but a count it could not have produced is a violation.
func TestUnknownIncr(t *testing.T) {
	base := []Op{
		{Client: 0, Kind: "incr", Key: "n0", Out: s("1"), Call: 0, Ret: 1, Status: "ok"},
		{Client: 0, Kind: "incr", Key: "n0", Call: 2, Ret: 50, Status: "unknown"},
	}
	for _, c := range []struct {
		read string
		ok   bool
	}{{"1", true}, {"2", true}, {"3", false}} {
		ops := append(append([]Op{}, base...),
			Op{Client: 1, Kind: "get", Key: "n0", Out: s(c.read), Call: 60, Ret: 61, Status: "ok"})
		r := run(t, ops)
		if (r.Result == "Ok") != c.ok {
			t.Fatalf("read %s: want ok=%v: %+v", c.read, c.ok, r)
		}
	}
}

// An unknown SET may take effect late, even after later acknowledged operations of others.
func TestUnknownSetMayLandLate(t *testing.T) {
	r := run(t, []Op{
		{Client: 0, Kind: "set", Key: "k0", Value: "x", Call: 0, Ret: 100, Status: "unknown"},
		{Client: 1, Kind: "set", Key: "k0", Value: "y", Call: 10, Ret: 20, Status: "ok"},
		{Client: 1, Kind: "get", Key: "k0", Out: s("y"), Call: 21, Ret: 22, Status: "ok"},
		{Client: 1, Kind: "get", Key: "k0", Out: s("x"), Call: 30, Ret: 31, Status: "ok"},
	})
	if r.Result != "Ok" {
		t.Fatalf("want Ok: %+v", r)
	}
	// But it cannot be undone: y again after x is not linearizable.
	r = run(t, []Op{
		{Client: 0, Kind: "set", Key: "k0", Value: "x", Call: 0, Ret: 100, Status: "unknown"},
		{Client: 1, Kind: "set", Key: "k0", Value: "y", Call: 10, Ret: 20, Status: "ok"},
		{Client: 1, Kind: "get", Key: "k0", Out: s("x"), Call: 30, Ret: 31, Status: "ok"},
		{Client: 1, Kind: "get", Key: "k0", Out: s("y"), Call: 32, Ret: 33, Status: "ok"},
	})
	if r.Result != "Illegal" {
		t.Fatalf("want Illegal: %+v", r)
	}
}

// Lost acknowledged writes are found from the final reads (and are violations too).
func TestLostWrites(t *testing.T) {
	r := run(t, []Op{
		{Client: 0, Kind: "set", Key: "k0", Value: "a", Call: 0, Ret: 10, Status: "ok"},
		{Client: 0, Kind: "set", Key: "k0", Value: "b", Call: 11, Ret: 20, Status: "ok"},
		{Client: 0, Kind: "incr", Key: "n0", Out: s("1"), Call: 21, Ret: 22, Status: "ok"},
		{Client: 0, Kind: "incr", Key: "n0", Out: s("2"), Call: 23, Ret: 24, Status: "ok"},
		{Client: 0, Kind: "set", Key: "k1", Value: "c", Call: 25, Ret: 26, Status: "ok"},
		// After a failover that lost the last epoch: k0 back to a, n0 back to 1, k1 absent.
		{Client: 9, Kind: "get", Key: "k0", Out: s("a"), Call: 40, Ret: 41, Status: "ok", Final: true},
		{Client: 9, Kind: "get", Key: "n0", Out: s("1"), Call: 40, Ret: 41, Status: "ok", Final: true},
		{Client: 9, Kind: "get", Key: "k1", Out: nil, Call: 40, Ret: 41, Status: "ok", Final: true},
	})
	if r.LostWrites != 3 || r.Result != "Illegal" {
		t.Fatalf("want 3 lost writes and Illegal: %+v", r)
	}
	// A write whose outcome is unknown is not lost when it did not happen.
	r = run(t, []Op{
		{Client: 0, Kind: "set", Key: "k0", Value: "a", Call: 0, Ret: 10, Status: "ok"},
		{Client: 0, Kind: "set", Key: "k0", Value: "b", Call: 11, Ret: 20, Status: "unknown"},
		{Client: 9, Kind: "get", Key: "k0", Out: s("a"), Call: 40, Ret: 41, Status: "ok", Final: true},
	})
	if r.LostWrites != 0 || r.Result != "Ok" {
		t.Fatalf("want Ok: %+v", r)
	}
}

// realHistory is a slice of a real campaign trial: a power cut of the primary's machine under
// 8 clients, keys k0 (SET/GET) and n0 (INCR/GET), with the operations whose outcome the clients
// never learnt and the final reads.
func realHistory(t *testing.T) []Op {
	t.Helper()
	f, err := os.Open("testdata/primary-kill.json.gz")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	z, err := gzip.NewReader(f)
	if err != nil {
		t.Fatal(err)
	}
	var h History
	if err := json.NewDecoder(z).Decode(&h); err != nil {
		t.Fatal(err)
	}
	return h.Ops
}

// The real history passes; each small corruption of it, of the kind a failover bug would cause,
// is found.
func TestRealHistoryAndItsCorruptions(t *testing.T) {
	ops := realHistory(t)
	unknown := 0
	for _, o := range ops {
		if o.Status == "unknown" {
			unknown++
		}
	}
	if unknown == 0 {
		t.Fatal("the sample should hold operations with unknown outcomes")
	}
	if r := run(t, ops); r.Result != "Ok" || r.LostWrites != 0 {
		t.Fatalf("the real history: %+v", r)
	}

	// A stale read: a GET of k0 that returned the value of an acknowledged SET w is made to
	// return the value w overwrote, although w had returned before the GET was called.
	sets := map[string]Op{}
	var acked []Op
	for _, o := range ops {
		if o.Key == "k0" && o.Kind == "set" {
			sets[o.Value] = o
			if o.Status == "ok" {
				acked = append(acked, o)
			}
		}
	}
	stale := append([]Op{}, ops...)
	done := false
	for i, o := range stale {
		if done || o.Key != "k0" || o.Kind != "get" || o.Status != "ok" || o.Out == nil || o.Final {
			continue
		}
		w, ok := sets[*o.Out]
		if !ok || w.Status != "ok" || w.Ret >= o.Call {
			continue
		}
		// An acknowledged SET that returned before w was called.
		for _, p := range acked {
			if p.Ret < w.Call && p.Value != w.Value {
				stale[i].Out = s(p.Value)
				done = true
				break
			}
		}
	}
	if !done {
		t.Fatal("no read to corrupt")
	}
	if r := run(t, stale); r.Result != "Illegal" {
		t.Fatalf("a stale read was not found: %+v", r)
	}

	// A lost write: the final read of k0 returns a value written before the last acknowledged
	// SET was called.
	last := acked[len(acked)-1]
	var older *Op
	for i := range acked {
		if acked[i].Ret < last.Call {
			older = &acked[i]
		}
	}
	lost := append([]Op{}, ops...)
	for i, o := range lost {
		if o.Final && o.Key == "k0" {
			lost[i].Out = s(older.Value)
		}
	}
	if r := run(t, lost); r.LostWrites == 0 || r.Result != "Illegal" {
		t.Fatalf("a lost write was not found: %+v", r)
	}

	// A lost increment: the final count one below the highest acknowledged INCR's result.
	high := int64(0)
	for _, o := range ops {
		if o.Key == "n0" && o.Kind == "incr" && o.Status == "ok" && o.Out != nil {
			if v, err := strconv.ParseInt(*o.Out, 10, 64); err == nil && v > high {
				high = v
			}
		}
	}
	less := append([]Op{}, ops...)
	for i, o := range less {
		if o.Final && o.Key == "n0" {
			less[i].Out = s(strconv.FormatInt(high-1, 10))
		}
	}
	if r := run(t, less); r.LostWrites == 0 || r.Result != "Illegal" {
		t.Fatalf("a lost increment was not found: %+v", r)
	}
}
