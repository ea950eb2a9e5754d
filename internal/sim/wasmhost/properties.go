package wasmhost

import (
	"encoding/binary"
	"net"
	"strconv"
	"strings"
)

// property answers proxy_get_property. Paths are NUL-separated segments
// ("request\x00path"), as Envoy parses them. Values are serialized as Envoy
// serializes CEL values: strings raw, integers as 8-byte little-endian,
// maps as header pairs.
//
// Supported: request.{path,url_path,host,scheme,method,headers,referer,
// useragent,id,query,protocol,time,size,total_size}, response.{code,
// code_details,headers,size}, source.{address,port},
// destination.{address,port}, upstream.{address,port}, plugin_name,
// plugin_root_id, plugin_vm_id, cluster_name, route_name, and values set
// with proxy_set_property. Header-backed request values exist only while
// the request header map does (see the package doc), as in Envoy.
func (v *vm) property(c *wctx, path string) ([]byte, Status) {
	parts := strings.Split(path, "\x00")
	if len(parts) == 0 || parts[0] == "" {
		return nil, StatusNotFound
	}
	str := func(s string) ([]byte, Status) { return []byte(s), StatusOK }
	i64 := func(x int64) ([]byte, Status) {
		b := make([]byte, 8)
		binary.LittleEndian.PutUint64(b, uint64(x))
		return b, StatusOK
	}
	root := c.rootCtx()
	filter := v.h.cfg.Filters[root.filter]
	if len(parts) == 1 {
		switch parts[0] {
		case "plugin_name":
			return str(filter.name())
		case "plugin_root_id":
			return str(filter.RootID)
		case "plugin_vm_id":
			return str(v.h.cfg.VMID)
		}
	}
	s := c.s
	if s == nil {
		return nil, StatusNotFound
	}
	if val, ok := s.getProperty(path); ok {
		return val, StatusOK
	}
	switch parts[0] {
	case "cluster_name":
		if s.routed {
			return str(v.h.cfg.RouteCluster)
		}
	case "route_name":
		return str("kvroute")
	case "request":
		var hm *headerMap
		if c.accessLog {
			hm = s.reqHeaders
		} else {
			hm = c.reqHeaders
		}
		if len(parts) < 2 {
			return nil, StatusNotFound
		}
		switch parts[1] {
		case "protocol":
			return str(s.r.Proto)
		case "time":
			return i64(s.start.UnixNano())
		case "size":
			return i64(s.reqBodySize)
		case "total_size":
			return i64(s.reqBodySize + int64(s.reqHeaders.byteSize()))
		}
		if hm == nil {
			return nil, StatusNotFound
		}
		hv := func(k string) ([]byte, Status) {
			if x, ok := hm.get(k); ok {
				return str(x)
			}
			return nil, StatusNotFound
		}
		switch parts[1] {
		case "path":
			return hv(":path")
		case "url_path":
			p, _ := hm.get(":path")
			if i := strings.IndexByte(p, '?'); i >= 0 {
				p = p[:i]
			}
			return str(p)
		case "query":
			p, _ := hm.get(":path")
			if i := strings.IndexByte(p, '?'); i >= 0 {
				return str(p[i+1:])
			}
			return str("")
		case "host":
			return hv(":authority")
		case "scheme":
			return hv(":scheme")
		case "method":
			return hv(":method")
		case "referer":
			return hv("referer")
		case "useragent":
			return hv("user-agent")
		case "id":
			return hv("x-request-id")
		case "headers":
			if len(parts) == 3 {
				return hv(parts[2])
			}
			return encodePairs(hm.pairs), StatusOK
		}
	case "response":
		if len(parts) < 2 || s.respHeaders == nil {
			return nil, StatusNotFound
		}
		switch parts[1] {
		case "code":
			code, _ := strconv.Atoi(func() string { x, _ := s.respHeaders.get(":status"); return x }())
			return i64(int64(code))
		case "code_details":
			return str(s.details)
		case "size":
			return i64(s.respBodySize)
		case "headers":
			if len(parts) == 3 {
				if x, ok := s.respHeaders.get(parts[2]); ok {
					return str(x)
				}
				return nil, StatusNotFound
			}
			return encodePairs(s.respHeaders.pairs), StatusOK
		}
	case "source", "destination", "upstream":
		addr := s.r.RemoteAddr
		switch parts[0] {
		case "destination":
			addr = s.localAddr
		case "upstream":
			addr = s.upstreamAddr
		}
		if addr == "" || len(parts) != 2 {
			return nil, StatusNotFound
		}
		switch parts[1] {
		case "address":
			return str(addr)
		case "port":
			_, port, err := net.SplitHostPort(addr)
			if err != nil {
				return nil, StatusNotFound
			}
			n, _ := strconv.Atoi(port)
			return i64(int64(n))
		}
	}
	return nil, StatusNotFound
}
