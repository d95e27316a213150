package keys

import (
	"fmt"

	"go.yaml.in/yaml/v3"
)

// fieldSpecNames are the YAML names of FieldSpec's fields.
var fieldSpecNames = map[string]bool{"source": true, "header": true, "json_path": true, "subject_token": true}

// UnmarshalYAML decodes a key configuration over c (normally
// DefaultKeyConfig), replacing a field spec named in the mapping as a whole
// (the key's, the scope's, the version's; max_length is kept unless given): `key: {json_path: id}` is refused for
// its missing source rather than keeping the default header source with a
// stray path. Unknown names are errors; merge keys ("<<") are not supported.
func (c *KeyConfig) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind == yaml.AliasNode && n.Alias != nil {
		n = n.Alias
	}
	if n.Kind != yaml.MappingNode {
		return &yaml.TypeError{Errors: []string{fmt.Sprintf("line %d: key: want a mapping, found %s", n.Line, n.ShortTag())}}
	}
	var errs []string
	fieldGiven := false
	var scopeNode, versionNode *yaml.Node
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		switch {
		case fieldSpecNames[k.Value]:
			fieldGiven = true
		case k.Value == "scope":
			scopeNode = v
		case k.Value == "version":
			versionNode = v
		case k.Value == "max_length":
		default:
			errs = append(errs, fmt.Sprintf("line %d: field %s not found in type keys.KeyConfig", k.Line, k.Value))
		}
	}
	for _, s := range []*yaml.Node{scopeNode, versionNode} {
		if s == nil {
			continue
		}
		if s.Kind == yaml.AliasNode && s.Alias != nil {
			s = s.Alias
		}
		if s.Kind == yaml.MappingNode {
			for i := 0; i+1 < len(s.Content); i += 2 {
				if k := s.Content[i]; !fieldSpecNames[k.Value] {
					errs = append(errs, fmt.Sprintf("line %d: field %s not found in type keys.FieldSpec", k.Line, k.Value))
				}
			}
		}
	}
	if len(errs) > 0 {
		return &yaml.TypeError{Errors: errs}
	}
	type plain KeyConfig // without this method
	out := plain(*c)
	if fieldGiven {
		out.Field = FieldSpec{}
	}
	if scopeNode != nil {
		out.Scope = FieldSpec{}
	}
	if versionNode != nil {
		out.Version = FieldSpec{}
	}
	if err := n.Decode(&out); err != nil {
		return err
	}
	*c = KeyConfig(out)
	return nil
}
