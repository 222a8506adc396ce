// sample stand-in for tutor's definition (code is not read by machine_nb)
export default { name: "tutor" };
