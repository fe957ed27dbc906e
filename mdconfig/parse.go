package mdconfig

import (
	"fmt"

	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/hclsyntax"
	"github.com/zclconf/go-cty/cty"
	"github.com/zclconf/go-cty/cty/convert"
)

// The schema is declared by hand rather than through gohcl struct tags
// because every value needs its own source range: most mistakes in a network
// description (an unknown subdevice, a host in two host blocks, a gateway
// that may not forward) are found after decoding and must still point at the
// line and column to change.

var rootSchema = &hcl.BodySchema{
	Attributes: []hcl.AttributeSchema{
		{Name: "penalty"},
		{Name: "alternatives"},
		{Name: "max_routes"},
		{Name: "failover"},
	},
	Blocks: []hcl.BlockHeaderSchema{
		{Type: "size_class", LabelNames: []string{"name"}},
		{Type: "subdevice", LabelNames: []string{"name"}},
		{Type: "network", LabelNames: []string{"name"}},
		{Type: "host", LabelNames: []string{"hosts"}},
	},
}

var sizeClassSchema = &hcl.BodySchema{
	Attributes: []hcl.AttributeSchema{{Name: "max"}, {Name: "typical"}},
}

var perfAttrs = []hcl.AttributeSchema{{Name: "latency"}, {Name: "bandwidth"}}

var classOverride = hcl.BlockHeaderSchema{Type: "class", LabelNames: []string{"size_class"}}

var subdeviceSchema = &hcl.BodySchema{
	Attributes: append([]hcl.AttributeSchema{{Name: "reach"}, {Name: "hosts"}}, perfAttrs...),
	Blocks:     []hcl.BlockHeaderSchema{classOverride},
}

var networkSchema = &hcl.BodySchema{
	Attributes: append([]hcl.AttributeSchema{{Name: "subdevice", Required: true}, {Name: "hosts", Required: true}, {Name: "standby"}}, perfAttrs...),
	Blocks:     []hcl.BlockHeaderSchema{classOverride},
}

var hostSchema = &hcl.BodySchema{
	Attributes: []hcl.AttributeSchema{{Name: "penalty", Required: true}},
}

var perfSchema = &hcl.BodySchema{Attributes: perfAttrs}

// value is one decoded attribute value and where it was written.
type value struct {
	s   string
	rng hcl.Range
}

// perf is a latency and bandwidth as written; either may be absent.
type perf struct {
	latency, bandwidth *value
}

type classPerf struct {
	class value // the size class named in the block label
	perf
}

type rawClass struct {
	name         value
	max, typical *value
}

type rawSubdevice struct {
	name      value
	reach     *value
	hosts     []value
	hostsAttr *hcl.Range
	perf
	classes []classPerf
}

type rawNetwork struct {
	name      value
	subdevice value
	hosts     []value
	standby   *value
	perf
	classes []classPerf
}

type rawHost struct {
	pattern value
	penalty value
}

// rawDoc is a description decoded but not yet checked for meaning.
type rawDoc struct {
	penalty, alternatives, maxRoutes, failover *value
	classes                                    []rawClass
	subdevices                                 []rawSubdevice
	networks                                   []rawNetwork
	hosts                                      []rawHost
}

// decode parses HCL source into a rawDoc. Syntax and schema errors come back
// as HCL diagnostics, which already carry ranges and "did you mean" hints.
func decode(src []byte, filename string) (*rawDoc, hcl.Diagnostics) {
	file, diags := hclsyntax.ParseConfig(src, filename, hcl.InitialPos)
	if diags.HasErrors() {
		return nil, diags
	}
	content, d := file.Body.Content(rootSchema)
	diags = append(diags, d...)
	doc := &rawDoc{}
	doc.penalty = optString(content.Attributes, "penalty", &diags)
	doc.alternatives = optString(content.Attributes, "alternatives", &diags)
	doc.maxRoutes = optString(content.Attributes, "max_routes", &diags)
	doc.failover = optString(content.Attributes, "failover", &diags)
	for _, b := range content.Blocks {
		name := value{b.Labels[0], b.LabelRanges[0]}
		switch b.Type {
		case "size_class":
			c, d := b.Body.Content(sizeClassSchema)
			diags = append(diags, d...)
			doc.classes = append(doc.classes, rawClass{
				name:    name,
				max:     optString(c.Attributes, "max", &diags),
				typical: optString(c.Attributes, "typical", &diags),
			})
		case "subdevice":
			c, d := b.Body.Content(subdeviceSchema)
			diags = append(diags, d...)
			s := rawSubdevice{name: name, reach: optString(c.Attributes, "reach", &diags), perf: decodePerf(c.Attributes, &diags)}
			if a, ok := c.Attributes["hosts"]; ok {
				s.hosts = stringList(a, &diags)
				s.hostsAttr = a.Range.Ptr()
			}
			s.classes = decodeClassBlocks(c.Blocks, &diags)
			doc.subdevices = append(doc.subdevices, s)
		case "network":
			c, d := b.Body.Content(networkSchema)
			diags = append(diags, d...)
			n := rawNetwork{name: name, perf: decodePerf(c.Attributes, &diags), standby: optString(c.Attributes, "standby", &diags)}
			if v := optString(c.Attributes, "subdevice", &diags); v != nil {
				n.subdevice = *v
			}
			if a, ok := c.Attributes["hosts"]; ok {
				n.hosts = stringList(a, &diags)
			}
			n.classes = decodeClassBlocks(c.Blocks, &diags)
			doc.networks = append(doc.networks, n)
		case "host":
			c, d := b.Body.Content(hostSchema)
			diags = append(diags, d...)
			h := rawHost{pattern: name}
			if v := optString(c.Attributes, "penalty", &diags); v != nil {
				h.penalty = *v
			}
			doc.hosts = append(doc.hosts, h)
		}
	}
	return doc, diags
}

func decodePerf(attrs hcl.Attributes, diags *hcl.Diagnostics) perf {
	return perf{
		latency:   optString(attrs, "latency", diags),
		bandwidth: optString(attrs, "bandwidth", diags),
	}
}

func decodeClassBlocks(blocks hcl.Blocks, diags *hcl.Diagnostics) []classPerf {
	var out []classPerf
	for _, b := range blocks {
		c, d := b.Body.Content(perfSchema)
		*diags = append(*diags, d...)
		cp := classPerf{class: value{b.Labels[0], b.LabelRanges[0]}, perf: decodePerf(c.Attributes, diags)}
		if cp.latency == nil && cp.bandwidth == nil {
			*diags = append(*diags, &hcl.Diagnostic{
				Severity: hcl.DiagWarning,
				Summary:  fmt.Sprintf("class %q overrides nothing", cp.class.s),
				Detail:   "Set latency and/or bandwidth inside the block, or remove it.",
				Subject:  b.DefRange.Ptr(),
			})
		}
		out = append(out, cp)
	}
	return out
}

// optString evaluates an optional attribute as a string. Numbers and bools
// are converted so that the unit parsers can say what is missing ("5" has no
// unit) instead of a bare type error.
func optString(attrs hcl.Attributes, name string, diags *hcl.Diagnostics) *value {
	a, ok := attrs[name]
	if !ok {
		return nil
	}
	s, ok := exprString(a.Expr, fmt.Sprintf("%q", name), diags)
	if !ok {
		return nil
	}
	return &value{s, a.Expr.Range()}
}

func exprString(expr hcl.Expression, what string, diags *hcl.Diagnostics) (string, bool) {
	v, d := expr.Value(nil)
	*diags = append(*diags, d...)
	if d.HasErrors() {
		return "", false
	}
	bad := func(detail string) (string, bool) {
		*diags = append(*diags, &hcl.Diagnostic{
			Severity: hcl.DiagError,
			Summary:  fmt.Sprintf("invalid value for %s", what),
			Detail:   detail,
			Subject:  expr.Range().Ptr(),
		})
		return "", false
	}
	if v.IsNull() || !v.IsWhollyKnown() {
		return bad("A value is required here.")
	}
	if !v.Type().IsPrimitiveType() {
		return bad(fmt.Sprintf("Expected a string, got %s.", v.Type().FriendlyName()))
	}
	sv, err := convert.Convert(v, cty.String)
	if err != nil {
		return bad(fmt.Sprintf("Expected a string: %v.", err))
	}
	return sv.AsString(), true
}

// stringList decodes a list of strings keeping each element's range, so that
// a bad host pattern is reported at its own column.
func stringList(a *hcl.Attribute, diags *hcl.Diagnostics) []value {
	exprs, d := hcl.ExprList(a.Expr)
	if d.HasErrors() {
		*diags = append(*diags, &hcl.Diagnostic{
			Severity: hcl.DiagError,
			Summary:  fmt.Sprintf("%q must be a list", a.Name),
			Detail:   fmt.Sprintf("Write a list of strings, e.g. %s = [\"a[01-16]\", \"gw1\"].", a.Name),
			Subject:  a.Expr.Range().Ptr(),
		})
		return nil
	}
	out := make([]value, 0, len(exprs))
	for _, e := range exprs {
		if s, ok := exprString(e, fmt.Sprintf("an element of %q", a.Name), diags); ok {
			out = append(out, value{s, e.Range()})
		}
	}
	return out
}
