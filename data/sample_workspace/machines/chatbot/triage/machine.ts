// sample stand-in for chatbot/triage's definition (code is not read by machine_nb)
export default { name: "chatbot/triage" };
