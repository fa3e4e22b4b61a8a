// Bindings for augmentation steps: stoker.transforms turns torchvision-style
// objects into TransformStep lists, and stoker.transforms.apply runs one
// image through them, drawing or replaying each step's parameters.
#include <pybind11/stl.h>

#include <cmath>

#include "common.h"
#include "stoker/augment.h"
#include "stoker/loader.h"
#include "stoker/pillow.h"

namespace stoker_python {
namespace {

// {"name": "RandomRotation", "angle": 3.5, "children": [...]} <-> StepParams.
py::dict ParamsToDict(const stoker::StepParams& p) {
  py::dict d;
  d["name"] = p.name;
  for (const auto& [key, value] : p.values) {
    if (std::isnan(value)) {
      d[py::str(key)] = py::none();  // not drawn (a ColorJitter component left out)
    } else {
      d[py::str(key)] = value;
    }
  }
  if (!p.children.empty()) {
    py::list children;
    for (const auto& c : p.children) children.append(ParamsToDict(c));
    d["children"] = children;
  }
  return d;
}

stoker::StepParams ParamsFromDict(const py::handle& h) {
  if (!py::isinstance<py::dict>(h))
    throw py::type_error("each step's parameters are a dict, as trace['steps'] reports them");
  stoker::StepParams p;
  for (const auto& [key, value] : py::reinterpret_borrow<py::dict>(h)) {
    const std::string k = py::str(key);
    if (k == "name") {
      p.name = py::str(value);
    } else if (k == "children") {
      for (const auto& c : value) p.children.push_back(ParamsFromDict(c));
    } else {
      p.values.emplace_back(k, value.is_none() ? std::nan("") : py::cast<double>(value));
    }
  }
  return p;
}

}  // namespace

void BindAugment(py::module_& m) {
  py::class_<stoker::TransformStep>(m, "TransformStep")
      .def(py::init([](std::string name, std::vector<std::pair<std::string, std::vector<double>>> args,
                       std::vector<std::pair<std::string, std::string>> words,
                       std::vector<stoker::TransformStep> children) {
             return stoker::TransformStep{std::move(name), std::move(args), std::move(words), std::move(children)};
           }),
           py::arg("name"), py::arg("args") = std::vector<std::pair<std::string, std::vector<double>>>{},
           py::arg("words") = std::vector<std::pair<std::string, std::string>>{},
           py::arg("children") = std::vector<stoker::TransformStep>{})
      .def_readonly("name", &stoker::TransformStep::name)
      .def_readonly("args", &stoker::TransformStep::args)
      .def_readonly("words", &stoker::TransformStep::words)
      .def_readonly("children", &stoker::TransformStep::children);

  m.def("check_step", [](const stoker::TransformStep& step) { Check(stoker::CheckTransformStep(step)); });
  // 13: Pillow >= 13's resize pass order; 12: earlier releases' (stoker/pillow.h).
  m.def("set_pillow_resize_order", [](int major) {
    stoker::SetPillowResizeOrder(major >= 13 ? stoker::PillowResizeOrder::kPillow13
                                             : stoker::PillowResizeOrder::kBefore13);
  });
  m.def("pillow_resize_order",
        [] { return stoker::GetPillowResizeOrder() == stoker::PillowResizeOrder::kPillow13 ? 13 : 12; });

  m.def(
      "augment_image",
      [](py::bytes pixels, int width, int height, const std::vector<stoker::TransformStep>& steps, std::uint64_t seed,
         std::uint64_t epoch, std::uint64_t sample, py::object replay) {
        const std::string bytes = pixels;
        std::vector<stoker::StepParams> given;
        if (!replay.is_none())
          for (const auto& h : replay) given.push_back(ParamsFromDict(h));
        stoker::Result<stoker::AugmentedImage> made = stoker::Status::Internal("not run");
        {
          py::gil_scoped_release release;
          made = stoker::AugmentImage({reinterpret_cast<const std::uint8_t*>(bytes.data()), bytes.size()}, width,
                                      height, steps, seed, epoch, sample, replay.is_none() ? nullptr : &given);
        }
        stoker::AugmentedImage result = Unwrap(std::move(made));
        py::list used;
        for (const auto& s : result.steps) used.append(ParamsToDict(s));
        return py::make_tuple(py::bytes(reinterpret_cast<const char*>(result.rgb.data()), result.rgb.size()),
                              result.width, result.height, used);
      },
      py::arg("pixels"), py::arg("width"), py::arg("height"), py::arg("steps"), py::arg("seed") = 0,
      py::arg("epoch") = 0, py::arg("sample") = 0, py::arg("replay") = py::none());

  // Decodes (or takes RGB pixels) and transforms one image; `replay` gives
  // every step's parameters instead of drawing them.
  m.def(
      "transform_image",
      [](py::object encoded, const stoker::TransformOptions& t, std::uint64_t seed, std::uint64_t epoch,
         std::uint64_t sample, py::object pixels, int width, int height, py::object replay,
         std::optional<std::array<double, 4>> box, std::optional<bool> flip) {
        std::string encoded_bytes, pixel_bytes;
        stoker::TransformInput input;
        if (!encoded.is_none()) {
          encoded_bytes = py::bytes(encoded);
          input.encoded = {reinterpret_cast<const std::byte*>(encoded_bytes.data()), encoded_bytes.size()};
        } else {
          pixel_bytes = py::bytes(pixels);
          input.rgb = {reinterpret_cast<const std::uint8_t*>(pixel_bytes.data()), pixel_bytes.size()};
          input.width = width;
          input.height = height;
        }
        input.seed = seed;
        input.epoch = epoch;
        input.sample = sample;
        input.box = box;
        input.flip = flip;
        std::vector<stoker::StepParams> given;
        if (!replay.is_none()) {
          for (const auto& h : replay) given.push_back(ParamsFromDict(h));
          input.replay = &given;
        }
        stoker::Result<stoker::TransformedImage> made = stoker::Status::Internal("not run");
        {
          py::gil_scoped_release release;
          made = stoker::TransformImage(input, t);
        }
        stoker::TransformedImage result = Unwrap(std::move(made));
        py::dict trace;
        trace["box"] = py::make_tuple(result.trace.x0, result.trace.y0, result.trace.x1, result.trace.y1);
        trace["flipped"] = result.trace.flipped;
        trace["decode_scale"] = result.trace.decode_scale;
        trace["source_size"] = py::make_tuple(result.trace.source_width, result.trace.source_height);
        py::list steps;
        for (const auto& s : result.trace.steps) steps.append(ParamsToDict(s));
        trace["steps"] = steps;
        return py::make_tuple(py::bytes(reinterpret_cast<const char*>(result.data.data()), result.data.size()), trace);
      },
      py::arg("encoded"), py::arg("options"), py::arg("seed") = 0, py::arg("epoch") = 0, py::arg("sample") = 0,
      py::arg("pixels") = py::none(), py::arg("width") = 0, py::arg("height") = 0, py::arg("replay") = py::none(),
      py::arg("box") = py::none(), py::arg("flip") = py::none());
}

}  // namespace stoker_python
