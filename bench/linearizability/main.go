// Command linearizability checks a key-value history recorded by the fault campaign
// (examples/fault_campaign.rs) with Porcupine (github.com/anishathalye/porcupine):
//
//   - linearizability of the whole history against a map of registers and counters, one
//     Porcupine partition per key (SET/GET on register keys, INCR/GET on counter keys);
//   - lost acknowledged writes, from the history's final reads (ops with "final": true): an
//     acknowledged SET is lost when its key finally holds nothing, a value nobody wrote, or the
//     value of a SET that returned before the lost one was called; an acknowledged INCR is lost
//     when the counter finally holds less than the value that INCR returned.
//
// An operation whose outcome the client could not learn (the connection dropped after the
// request was sent) has "status": "unknown": it is given an infinite return time (it may take
// effect at any moment after its call, or never) and any output. Reads with an unknown outcome
// and failed operations (a definite error reply) are left out.
//
// Usage: linearizability [-timeout 60s] [-visualize DIR] HISTORY.json...
// Prints one JSON line per history; exit status 0 when every history is linearizable with no
// lost write, 1 when one is not, 2 when the check timed out, 3 on bad input.
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/anishathalye/porcupine"
)

// Op is one recorded operation, as the campaign writes it.
type Op struct {
	Client int    `json:"client"`
	Kind   string `json:"op"` // "set", "get" or "incr"
	Key    string `json:"key"`
	// Value is what a SET writes.
	Value string `json:"value,omitempty"`
	// Out is what a GET read (null: no such key) or what an INCR returned (decimal).
	Out *string `json:"out,omitempty"`
	// Call and Ret are microseconds on the recorder's monotonic clock.
	Call   int64  `json:"call"`
	Ret    int64  `json:"ret"`
	Status string `json:"status"` // "ok", "unknown" or "fail"
	// Final marks the reads made after every client stopped (for the lost-write check).
	Final bool `json:"final,omitempty"`
}

// History is one trial's record.
type History struct {
	Trial string `json:"trial"`
	Ops   []Op   `json:"ops"`
}

// input is what the model sees of an operation.
type input struct {
	kind    string
	key     string
	value   string
	unknown bool
}

// Report is the checker's verdict on one history.
type Report struct {
	File    string `json:"file"`
	Trial   string `json:"trial"`
	Ops     int    `json:"ops"`
	Keys    int    `json:"keys"`
	Unknown int    `json:"unknown_ops"`
	// Result is Porcupine's: "Ok", "Illegal" or "Unknown" (timed out).
	Result       string   `json:"result"`
	IllegalKeys  []string `json:"illegal_keys,omitempty"`
	LostWrites   int      `json:"lost_writes"`
	Lost         []string `json:"lost,omitempty"`
	Visualized   string   `json:"visualization,omitempty"`
	CheckSeconds float64  `json:"check_s"`
	Error        string   `json:"error,omitempty"`
}

// kvModel: the state of one key is its value, "" when absent. A SET never writes "" (the
// campaign's values are never empty), so "" means "no such key" for GET; INCR treats it as 0.
var kvModel = porcupine.Model{
	Partition: func(history []porcupine.Operation) [][]porcupine.Operation {
		byKey := map[string][]porcupine.Operation{}
		var keys []string
		for _, op := range history {
			k := op.Input.(input).key
			if _, ok := byKey[k]; !ok {
				keys = append(keys, k)
			}
			byKey[k] = append(byKey[k], op)
		}
		sort.Strings(keys)
		out := make([][]porcupine.Operation, 0, len(keys))
		for _, k := range keys {
			out = append(out, byKey[k])
		}
		return out
	},
	Init: func() interface{} { return "" },
	Step: func(state, in, out interface{}) (bool, interface{}) {
		s := state.(string)
		i := in.(input)
		switch i.kind {
		case "set":
			return true, i.value
		case "get":
			return i.unknown || out.(string) == s, s
		case "incr":
			n := int64(0)
			if s != "" {
				v, err := strconv.ParseInt(s, 10, 64)
				if err != nil {
					return false, s // INCR on a value that is not a number fails
				}
				n = v
			}
			next := strconv.FormatInt(n+1, 10)
			return i.unknown || out.(string) == next, next
		}
		return false, s
	},
	Equal: func(a, b interface{}) bool { return a.(string) == b.(string) },
	DescribeOperation: func(in, out interface{}) string {
		i := in.(input)
		suffix := ""
		if i.unknown {
			suffix = " (outcome unknown)"
		}
		switch i.kind {
		case "set":
			return fmt.Sprintf("set(%s, %q)%s", i.key, i.value, suffix)
		case "get":
			return fmt.Sprintf("get(%s) -> %q%s", i.key, out, suffix)
		default:
			return fmt.Sprintf("incr(%s) -> %v%s", i.key, out, suffix)
		}
	},
	DescribeState: func(s interface{}) string { return fmt.Sprintf("%q", s) },
}

// operations turns the recorded history into Porcupine's operations.
func operations(ops []Op) ([]porcupine.Operation, int, error) {
	var out []porcupine.Operation
	unknown := 0
	for n, op := range ops {
		if op.Status == "fail" {
			continue
		}
		if op.Status != "ok" && op.Status != "unknown" {
			return nil, 0, fmt.Errorf("op %d: status %q", n, op.Status)
		}
		if op.Kind != "set" && op.Kind != "get" && op.Kind != "incr" {
			return nil, 0, fmt.Errorf("op %d: kind %q", n, op.Kind)
		}
		if op.Kind == "set" && op.Value == "" {
			return nil, 0, fmt.Errorf("op %d: a SET of the empty string", n)
		}
		unk := op.Status == "unknown"
		if unk && op.Kind == "get" {
			continue // a read whose answer never came changes nothing
		}
		if !unk && op.Kind == "incr" && op.Out == nil {
			return nil, 0, fmt.Errorf("op %d: an acknowledged INCR without its result", n)
		}
		if op.Ret < op.Call && !unk {
			return nil, 0, fmt.Errorf("op %d: returns (%d) before its call (%d)", n, op.Ret, op.Call)
		}
		ret := op.Ret
		if unk {
			unknown++
			ret = math.MaxInt64
		}
		o := ""
		if op.Out != nil {
			o = *op.Out
		}
		out = append(out, porcupine.Operation{
			ClientId: op.Client,
			Input:    input{kind: op.Kind, key: op.Key, value: op.Value, unknown: unk},
			Call:     op.Call,
			Output:   o,
			Return:   ret,
		})
	}
	return out, unknown, nil
}

// lostWrites applies the lost-write rule (see the package comment) to the final reads.
func lostWrites(ops []Op) []string {
	final := map[string]string{}
	for _, op := range ops {
		if op.Final && op.Kind == "get" && op.Status == "ok" {
			v := ""
			if op.Out != nil {
				v = *op.Out
			}
			final[op.Key] = v
		}
	}
	// Who wrote each value (values are unique per key).
	writer := map[string]map[string]Op{}
	for _, op := range ops {
		if op.Kind == "set" && op.Status != "fail" {
			if writer[op.Key] == nil {
				writer[op.Key] = map[string]Op{}
			}
			writer[op.Key][op.Value] = op
		}
	}
	var lost []string
	for _, op := range ops {
		if op.Status != "ok" || op.Final {
			continue
		}
		v, read := final[op.Key]
		if !read {
			continue // no final read of this key: nothing to check against
		}
		switch op.Kind {
		case "set":
			w, known := writer[op.Key][v]
			switch {
			case v == "":
				lost = append(lost, fmt.Sprintf("%s=%q acknowledged, finally absent", op.Key, op.Value))
			case !known:
				lost = append(lost, fmt.Sprintf("%s=%q acknowledged, finally %q (written by nobody)", op.Key, op.Value, v))
			case w.Status == "ok" && w.Ret < op.Call:
				lost = append(lost, fmt.Sprintf("%s=%q acknowledged at %d, finally %q written before it (returned at %d)", op.Key, op.Value, op.Ret, v, w.Ret))
			}
		case "incr":
			if op.Out == nil {
				continue
			}
			got, err1 := strconv.ParseInt(*op.Out, 10, 64)
			fin := int64(0)
			var err2 error
			if v != "" {
				fin, err2 = strconv.ParseInt(v, 10, 64)
			}
			if err1 != nil || err2 != nil || fin < got {
				lost = append(lost, fmt.Sprintf("incr %s -> %s acknowledged, finally %q", op.Key, *op.Out, v))
			}
		}
	}
	return lost
}

func check(path string, timeout time.Duration, visualize string) Report {
	r := Report{File: path}
	data, err := os.ReadFile(path)
	if err != nil {
		r.Error = err.Error()
		return r
	}
	var h History
	if err := json.Unmarshal(data, &h); err != nil {
		r.Error = fmt.Sprintf("parsing %s: %v", path, err)
		return r
	}
	r.Trial = h.Trial
	ops, unknown, err := operations(h.Ops)
	if err != nil {
		r.Error = fmt.Sprintf("%s: %v", path, err)
		return r
	}
	r.Ops, r.Unknown = len(ops), unknown
	keys := map[string]bool{}
	for _, op := range ops {
		keys[op.Input.(input).key] = true
	}
	r.Keys = len(keys)
	t0 := time.Now()
	res, info := porcupine.CheckOperationsVerbose(kvModel, ops, timeout)
	r.CheckSeconds = time.Since(t0).Seconds()
	r.Result = string(res)
	if res == porcupine.Illegal {
		// Which keys: check each partition alone.
		for _, part := range kvModel.Partition(ops) {
			one := porcupine.Model{
				Init: kvModel.Init, Step: kvModel.Step, Equal: kvModel.Equal,
			}
			if porcupine.CheckOperationsTimeout(one, part, timeout) == porcupine.Illegal {
				r.IllegalKeys = append(r.IllegalKeys, part[0].Input.(input).key)
			}
		}
		if visualize != "" {
			name := strings.TrimSuffix(filepath.Base(path), ".json") + ".html"
			out := filepath.Join(visualize, name)
			if err := porcupine.VisualizePath(kvModel, info, out); err == nil {
				r.Visualized = out
			}
		}
	}
	r.Lost = lostWrites(h.Ops)
	r.LostWrites = len(r.Lost)
	return r
}

func main() {
	timeout := flag.Duration("timeout", 60*time.Second, "give up on one history after this long")
	visualize := flag.String("visualize", "", "write Porcupine's HTML visualization of every illegal history to this directory")
	flag.Parse()
	if flag.NArg() == 0 {
		fmt.Fprintln(os.Stderr, "usage: linearizability [-timeout 60s] [-visualize DIR] HISTORY.json...")
		os.Exit(3)
	}
	status := 0
	enc := json.NewEncoder(os.Stdout)
	for _, path := range flag.Args() {
		r := check(path, *timeout, *visualize)
		if err := enc.Encode(r); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(3)
		}
		switch {
		case r.Error != "":
			status = max(status, 3)
		case r.Result == string(porcupine.Illegal) || r.LostWrites > 0:
			status = max(status, 1)
		case r.Result != string(porcupine.Ok):
			status = max(status, 2)
		}
	}
	os.Exit(status)
}
