package buildinfo

import "fmt"

// The two builds of the Wasm module. Envoy before 1.39 answers WASI
// poll_oneoff with an error, which Go's runtime treats as fatal once the
// netpoller runs: the standard module dies after hours of traffic there,
// and the envoy-compat module (a patched runtime, see internal/deploy/wasmbuild)
// is the one to load. Each variant has its own file, archive and image tag,
// so building one never replaces the other.
const (
	VariantStandard    = "standard"
	VariantEnvoyCompat = "envoy-compat"
)

// Variant names the artefacts of one build of the Wasm module.
type Variant struct {
	// Name is VariantStandard or VariantEnvoyCompat.
	Name string
	// Envoy is the Envoy range the variant is for.
	Envoy string
	// WasmFile is the module's file name under dist/.
	WasmFile string
	// OCIArchive is the file name of its OCI image archive under dist/.
	OCIArchive string
	// TagSuffix follows the version in the image tag: kvroute:v0.1.0-envoy-compat.
	TagSuffix string
}

// Variants lists both builds, standard first.
var Variants = []Variant{
	{Name: VariantStandard, Envoy: "Envoy 1.39 and later", WasmFile: "kvroute.wasm", OCIArchive: "kvroute-oci.tar"},
	{Name: VariantEnvoyCompat, Envoy: "Envoy 1.33 to 1.38", WasmFile: "kvroute-envoy-compat.wasm",
		OCIArchive: "kvroute-envoy-compat-oci.tar", TagSuffix: "-envoy-compat"},
}

// LookupVariant returns the variant called name.
func LookupVariant(name string) (Variant, error) {
	for _, v := range Variants {
		if v.Name == name {
			return v, nil
		}
	}
	return Variant{}, fmt.Errorf("unknown Wasm module variant %q (known: %s, %s)", name, VariantStandard, VariantEnvoyCompat)
}

// ImageTag is the tag of the variant's image for a release version:
// "v0.1.0" or "v0.1.0-envoy-compat".
func (v Variant) ImageTag(version string) string { return version + v.TagSuffix }

// Describe is the one-line form logged by the module at start:
// "envoy-compat build, for Envoy 1.33 to 1.38".
func (v Variant) Describe() string { return v.Name + " build, for " + v.Envoy }
