package scorer

import "strconv"

// AppendExplain appends a one-line explanation of d to dst: the chosen host,
// its total and per-scorer scores (score x weight), what the index matched
// for it, the fallbacks, how many hosts survived the filters, and the last
// plugin note. It contains addresses, numbers and plugin names only — never
// prompt text — so it is safe for logs and the debug header.
func AppendExplain(dst []byte, req *Request, hosts []Host, d *Decision) []byte {
	dst = append(dst, "profile="...)
	dst = append(dst, d.Profile...)
	p := d.Primary()
	if p < 0 || p >= len(hosts) {
		dst = append(dst, " host=none candidates="...)
		dst = strconv.AppendInt(dst, int64(d.Survivors), 10)
		dst = append(dst, '/')
		dst = strconv.AppendInt(dst, int64(d.Candidates), 10)
		return appendNote(dst, d.Note)
	}
	dst = append(dst, " host="...)
	dst = append(dst, hosts[p].Address...)
	if d.prof != nil && len(d.prof.Scorers) > 0 {
		dst = append(dst, " score="...)
		dst = strconv.AppendFloat(dst, d.Total[p], 'f', 3, 64)
		for i, ws := range d.prof.Scorers {
			if ws.adapterOnly && (req == nil || req.Adapter == "") {
				continue // not run for this request
			}
			dst = append(dst, ' ')
			dst = append(dst, ws.Name...)
			dst = append(dst, '=')
			dst = strconv.AppendFloat(dst, d.ScorerScore(i, p), 'f', 3, 64)
			dst = append(dst, 'x')
			dst = strconv.AppendFloat(dst, ws.Weight, 'g', 4, 64)
		}
	} else if d.prof != nil {
		dst = append(dst, " picker="...)
		dst = append(dst, d.prof.PickerName...)
	}
	if req != nil {
		b, _ := req.Matched(p)
		dst = append(dst, " matched="...)
		dst = strconv.AppendInt(dst, int64(b), 10)
		dst = append(dst, '/')
		dst = strconv.AppendInt(dst, int64(req.TotalBlocks), 10)
		dst = append(dst, "blk uncached="...)
		dst = strconv.AppendInt(dst, int64(req.Uncached(p)), 10)
		dst = append(dst, "tok"...)
	}
	if len(d.Order) > 1 {
		dst = append(dst, " fallbacks="...)
		for i, f := range d.Order[1:] {
			if i > 0 {
				dst = append(dst, ',')
			}
			if f >= 0 && f < len(hosts) {
				dst = append(dst, hosts[f].Address...)
			}
		}
	}
	dst = append(dst, " candidates="...)
	dst = strconv.AppendInt(dst, int64(d.Survivors), 10)
	dst = append(dst, '/')
	dst = strconv.AppendInt(dst, int64(d.Candidates), 10)
	return appendNote(dst, d.Note)
}

func appendNote(dst []byte, note string) []byte {
	if note == "" {
		return dst
	}
	dst = append(dst, " note="...)
	return strconv.AppendQuote(dst, note)
}

// Explain is AppendExplain into a new string.
func (d *Decision) Explain(req *Request, hosts []Host) string {
	return string(AppendExplain(nil, req, hosts, d))
}

// Explain explains a handler result: the decode (or only) decision, then
// the prefill decision when the request was disaggregated.
func (r *Result) Explain(req *Request, hosts []Host) string {
	b := AppendExplain(nil, req, hosts, &r.Decode)
	if r.Disaggregated {
		b = append(b, " | prefill: "...)
		b = AppendExplain(b, req, hosts, &r.Prefill)
	}
	return string(b)
}
